"""Whole tiny Hugging Face models on the device: what each kernel is, for the CPU model of CUDA.

Profiles tiny Llama and GPT-2 configs (random weights) through a lambda, eager and compiled,
the way users call them, and records each CUDA kernel's name, op, module and source. The
CPU tests (``tests/test_user_code.py``) check that a CPU report's CUDA range
(``FusionReport.cuda_kernel_range``) holds these counts, and the GPU tests that attribution
names every module. Prints one table row per model and form.

    PYTHONPATH=$PWD python3 benchmarks/model_counts.py --out DIR [--write-data [PATH]]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)
from _common import OUT_HELP, header, markdown_table, require_cuda, write_output_to  # noqa: E402

from pytest_fusioncheck.capture import profile_call  # noqa: E402

DATA = os.path.join(ROOT, "tests", "data", "model_counts_h200.json")
FORMS = ("eager", "compiled lambda", "compiled model")


def tiny_models() -> dict:
    """The tiny configs the tests use (``tests/test_user_code.py::hf_models``)."""
    import transformers

    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )).eval()
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0,
    )).eval()
    return {"llama": llama, "gpt2": gpt2}


def callable_for(model: torch.nn.Module, form: str):
    """``model`` as users call it: a lambda over it, compiled or not."""
    torch._dynamo.reset()
    if form == "eager":
        return lambda t: model(t).logits
    if form == "compiled lambda":
        return torch.compile(lambda t: model(t).logits)
    compiled = torch.compile(model)
    return lambda t: compiled(t).logits


def profile_model(model: torch.nn.Module, form: str, device: str):
    ids = torch.randint(0, 256, (2, 16), device=device)
    with torch.no_grad():
        return profile_call(callable_for(model, form), (ids,), {}, warmup=1, device=device, label=form, timing=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", metavar="DIR", default=".", help=OUT_HELP)
    parser.add_argument("--write-data", nargs="?", const=DATA, default=None, metavar="PATH")
    opts = parser.parse_args()
    require_cuda(__file__)
    os.makedirs(opts.out, exist_ok=True)
    write_output_to(opts.out, __file__)
    print(header())
    results, rows = {}, []
    for name, model in tiny_models().items():
        model = model.to("cuda")
        for form in FORMS:
            report = profile_model(model, form, "cuda")
            kernels = [{"name": k.name, "op": k.op, "module": k.module, "source": k.source, "bytes": k.bytes} for k in report.kernels]
            results[f"{name} {form}"] = {"cuda_kernel_count": report.kernel_count, "kernels": kernels}
            named = sum(1 for k in report.kernels if k.module)
            rows.append([name, form, report.kernel_count, f"{named}/{report.kernel_count}"])
    print(markdown_table(["model", "form", "CUDA kernels", "with a module"], rows))
    with open(os.path.join(opts.out, "model_counts.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    if opts.write_data:
        with open(opts.write_data, "w") as fh:
            json.dump({"device": header(), "models": results}, fh, indent=1, sort_keys=True)
        print(f"wrote {opts.write_data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
