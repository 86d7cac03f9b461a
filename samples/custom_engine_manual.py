"""Instrument your own engine by hand with perfscope's manual API.

Run it:  python samples/custom_engine_manual.py [RUNS_DIR]

``MyEngine`` stands in for your code: a small PyTorch model that prefills a prompt and
then decodes one token at a time. The three perfscope calls are marked ``# perfscope``.
"""

from __future__ import annotations

import sys

import torch

import perfscope


class MyEngine:
    """A toy greedy decoder: embedding → 2-layer MLP → vocabulary logits."""

    def __init__(self, vocab: int = 512, width: int = 256, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(vocab, width)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )
        self.head = torch.nn.Linear(width, vocab)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(tokens)).mean(dim=1))


def main(runs_dir: str | None = None) -> perfscope.Run:
    engine = MyEngine()
    prompts = [torch.randint(0, 512, (1, n)) for n in (32, 64, 128, 64)]
    with perfscope.profile(
        name="my-engine", runs_dir=runs_dir, slos={"ttft": 0.5, "tpot": 0.05}
    ) as p:
        for prompt in prompts:
            with p.request(prompt_tokens=prompt.shape[1], max_output_tokens=16) as r:  # perfscope
                seq = prompt
                with p.step("prefill", batch_size=1, new_tokens=seq.shape[1]):  # perfscope
                    nxt = engine.forward(seq).argmax(-1, keepdim=True)
                r.tokens(1)  # perfscope: one token arrived
                for _ in range(15):
                    seq = torch.cat([seq, nxt], dim=1)
                    with p.step(
                        "decode", batch_size=1, new_tokens=1, context_tokens=seq.shape[1] - 1
                    ):
                        nxt = engine.forward(seq[:, -1:]).argmax(-1, keepdim=True)
                    r.tokens(1)
    run = p.run
    print(f"run stored in {run.path}")
    print(
        f"TTFT p50 {run.ttft.p50 * 1e3:.2f} ms, TPOT p50 {run.tpot.p50 * 1e3:.2f} ms, "
        f"{run.throughput.output_tok_s:.0f} output tokens/s, "
        f"SLO attainment {run.goodput.attainment:.0%}"
    )
    return run


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
