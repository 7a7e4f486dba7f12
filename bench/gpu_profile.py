"""Where a 70M training step's time goes on one GPU (run by hand there): the whole step, the transformer body alone
(the vocab-50257 head and its loss removed), and the top CUDA kernels of a compiled step. bf16 autocast, fused AdamW,
torch.compile, random tokens; prints a table and the profiler's top kernels."""

from __future__ import annotations

import time

import torch

from sparknet.model.presets import build_model, flops_per_token, get_preset

BATCH, SEQ, VOCAB, STEPS = 32, 1024, 50257, 20


def bench(name: str, model: torch.nn.Module, loss_fn, opt: torch.optim.Optimizer) -> float:
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t) / STEPS
    tps = BATCH * SEQ / seconds
    mfu = flops_per_token(get_preset("sparknet-70m"), VOCAB, SEQ) * tps / 989.5e12
    print(f"| {name} | {seconds * 1000:.1f} ms | {tps:,.0f} | {mfu:.1%} |", flush=True)
    return seconds


def full(model, ids):
    return model(input_ids=ids, labels=ids).loss


def body(model, ids):
    return model.transformer(input_ids=ids).last_hidden_state.float().pow(2).mean()


def main() -> None:
    if not torch.cuda.is_available():
        print("bench/gpu_profile.py needs a CUDA GPU: skipped")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    print("| variant | step | tokens/s | MFU (full-model FLOPs) |\n|---|---:|---:|---:|")
    for compiled in (False, True):
        for name, fn in (("full step", full), ("body only (no head, no CE)", body)):
            torch.manual_seed(0)
            model = build_model(get_preset("sparknet-70m"), VOCAB, VOCAB - 1).cuda().train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
            target = torch.compile(model) if compiled else model
            if fn is body and compiled:
                model.transformer = torch.compile(model.transformer)
                target = model
            bench(f"{name}{' compiled' if compiled else ''}", target, fn, opt)
            if compiled and fn is full:
                ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(3):
                        with torch.autocast("cuda", dtype=torch.bfloat16):
                            loss = full(target, ids)
                        loss.backward()
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70))
            del model, opt, target
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
