"""Prompt datasets for serving benchmarks: synthetic text of target token lengths, ShareGPT
conversations and a shared-prefix workload (prompt caching).

Every builder returns :class:`RequestSpec` lists (warmup requests first), reproducibly from
a seed. Token lengths are exact when a tokenizer is given (``--tokenizer``); without one,
synthetic text is built from common English words that most BPE vocabularies hold as one
token each (" the", " of", ...), so lengths are close, and the server's usage corrects the
recorded prompt length after the run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from perfscope.errors import UsageError, WorkloadError
from perfscope.profiler.records import RequestSpec

__all__ = [
    "DATASET_KINDS",
    "WORDS",
    "ServerTokenizer",
    "build_dataset_specs",
    "load_conversations",
    "load_sharegpt",
    "load_tokenizer",
    "load_tokenizer_for",
    "multi_turn_specs",
    "shared_prefix_prompts",
    "synthetic_text",
]

DATASET_KINDS = ("synthetic", "sharegpt", "shared-prefix", "multi-turn")

#: Frequent English words; each is a single token (with its leading space) in GPT-2, Llama
#: and most other BPE vocabularies.
_WORD_TEXT = """
the of and to in is that it was for on are as with his they at be this from have or by
one had not but what all were when we there can an your which their said if do will each
about how up out them then she many some so these would other into has more her two like
him see time could no make than first been its who now people my made over did down only
way find use may water long little very after words called just where most know get
through back much before go good new write our used me man too any day same right look
think also around another came come work three word must because does part even place
well such here take why things help put years different away again off went old number
great tell men say small every found still between name should home big give air line
set own under read last never us left end along while might next sound below saw
something thought both few those always looked show large often together asked house
world going want school important until form food keep children feet land side without
boy once animals life enough took sometimes four head above kind began almost live page
got earth need far hand high year mother light parts country father let night following
picture being study second eyes soon times story boys since white days ever paper hard
near sentence better best across during today others however sure means knew try told
young miles sun ways thing whole hear example heard several change answer room sea
against top turned learn point city play toward five using himself usually
"""
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class _Tok:
    """Adapter over a ``tokenizers.Tokenizer``: token count of a text, no special tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def synthetic_text(
    n_tokens: int, rng: np.random.Generator, tokenizer: Any | None = None
) -> tuple[str, int]:
    """Random English-word text of about ``n_tokens`` tokens (exactly, with a tokenizer).

    Returns the text and its token count (the target when no tokenizer is given).
    """
    if n_tokens < 1:
        raise WorkloadError(f"prompt length must be at least 1 token, got {n_tokens}")
    idx = rng.integers(0, len(WORDS), size=2 * n_tokens + 8)
    words = [WORDS[i] for i in idx]
    if tokenizer is None:
        return " ".join(words[:n_tokens]), n_tokens
    tok = _Tok(tokenizer)
    # Largest word count whose text has at most n_tokens tokens (counts grow with words).
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tok.count(" ".join(words[:mid])) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    got = tok.count(text)
    # Pad with single characters, each a token in any byte/char-level vocabulary.
    pad = 0
    while got < n_tokens and pad < 4 * n_tokens:
        cand = f"{text} a" if text else "a"
        c = tok.count(cand)
        if c > n_tokens:
            break
        text, got, pad = cand, c, pad + 1
    return text, got


def _conversation_pair(obj: Any) -> tuple[str, str | None] | None:
    """(first user turn, the reply after it) of a ShareGPT or OpenAI-messages record."""
    turns = None
    if isinstance(obj, dict):
        turns = obj.get("conversations") or obj.get("conversation") or obj.get("messages")
    if not isinstance(turns, list):
        return None
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            continue
        role = str(t.get("from", t.get("role", ""))).lower()
        if role in ("human", "user"):
            prompt = t.get("value", t.get("content"))
            if not isinstance(prompt, str) or not prompt.strip():
                return None
            reply = None
            if i + 1 < len(turns) and isinstance(turns[i + 1], dict):
                nxt = turns[i + 1]
                r = nxt.get("value", nxt.get("content"))
                reply = r if isinstance(r, str) else None
            return prompt, reply
    return None


def load_sharegpt(path: Path) -> list[tuple[str, str | None]]:
    """Prompt/reply pairs of a ShareGPT-format file (JSON array or JSONL).

    Each record has ``conversations`` (``from``: human/gpt, ``value``) or ``messages``
    (``role``: user/assistant, ``content``); the first user turn is the prompt and the turn
    after it the reference reply (its length becomes the output length).
    """
    if not path.is_file():
        raise WorkloadError(f"dataset file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read dataset {str(path)!r}: {exc}") from None
    records = _parse_records(path, text)
    pairs = [p for p in (_conversation_pair(r) for r in records) if p is not None]
    if not pairs:
        raise WorkloadError(
            f"dataset {str(path)!r} has no usable conversations: each record needs "
            "'conversations' [{'from': 'human', 'value': ...}, {'from': 'gpt', ...}] or "
            "'messages' [{'role': 'user', 'content': ...}]"
        )
    return pairs


def _parse_records(path: Path, text: str) -> list[Any]:
    """Records of a JSON array (or object) or JSONL dataset file."""
    records: list[Any]
    try:
        data = json.loads(text)
        records = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        records = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise WorkloadError(
                        f"{path}:{lineno}: not valid JSON ({exc.msg}); a ShareGPT dataset is a "
                        "JSON array or JSONL of {'conversations': [...]}"
                    ) from None
    return records


def load_conversations(path: Path) -> list[list[tuple[str, str]]]:
    """Conversations of a ShareGPT-format file as ``(role, text)`` turns, ``role`` ``user`` or
    ``assistant``, starting at the first user turn (for the ``multi-turn`` dataset)."""
    if not path.is_file():
        raise WorkloadError(f"dataset file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"cannot read dataset {str(path)!r}: {exc}") from None
    out: list[list[tuple[str, str]]] = []
    for rec in _parse_records(path, text):
        turns = None
        if isinstance(rec, dict):
            turns = rec.get("conversations") or rec.get("conversation") or rec.get("messages")
        conv: list[tuple[str, str]] = []
        for t in turns if isinstance(turns, list) else ():
            if not isinstance(t, dict):
                continue
            role = str(t.get("from", t.get("role", ""))).lower()
            value = t.get("value", t.get("content"))
            if not isinstance(value, str) or not value.strip():
                continue
            kind = "user" if role in ("human", "user") else "assistant"
            if kind == "assistant" and role not in ("gpt", "assistant", "bot", "model"):
                continue
            if not conv and kind != "user":
                continue
            conv.append((kind, value))
        if conv:
            out.append(conv)
    if not out:
        raise WorkloadError(f"dataset {str(path)!r} has no conversations with a user turn")
    return out


def _history_text(turns: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"{'User' if r == 'user' else 'Assistant'}: {t}" for r, t in turns)


def multi_turn_specs(
    n: int,
    warmup: int,
    turns: int,
    prompt_lens: Any,
    output_lens: Any,
    rng: np.random.Generator,
    text_rng: np.random.Generator,
    tokenizer: Any | None = None,
    path: Path | None = None,
    output_len_given: bool = False,
) -> list[RequestSpec]:
    """Conversations of ``turns`` user turns; each request resends the whole history so far
    (earlier user turns and replies) plus the next user turn, so a server with prefix caching
    can reuse it. Requests go turn by turn over all conversations (ids in that order), and
    each turn waits for the previous turn of its conversation to finish (``after``).

    The replies in the history are the dataset's reference replies (``path``) or synthetic
    text of the output length, not what the server answered (it is not known in advance).
    """
    if turns < 1:
        raise WorkloadError(f"--turns must be at least 1, got {turns}")
    total = warmup + n
    n_conv = math.ceil(total / turns)
    convs: list[list[tuple[str, str]]] = []
    if path is not None:
        pool = [c for c in load_conversations(path) if sum(r == "user" for r, _ in c) >= 1]
        order = rng.permutation(len(pool))
        convs = [pool[int(order[i % len(pool)])] for i in range(n_conv)]
    p_lens = prompt_lens.sample(rng, n_conv * turns).reshape(n_conv, turns)
    o_lens = output_lens.sample(rng, n_conv * turns).reshape(n_conv, turns)
    tok = _Tok(tokenizer) if tokenizer is not None else None

    def count(text: str) -> int:
        return tok.count(text) if tok is not None else max(1, math.ceil(len(text.split())))

    # Per conversation: the (user, reply, reply tokens) of each turn.
    plan: list[list[tuple[str, str, int]]] = []
    for c in range(n_conv):
        rows: list[tuple[str, str, int]] = []
        if convs:
            conv = convs[c]
            users = [i for i, (r, _) in enumerate(conv) if r == "user"]
            for k in range(turns):
                ui = users[k % len(users)]
                user = conv[ui][1]
                reply = (
                    conv[ui + 1][1] if ui + 1 < len(conv) and conv[ui + 1][0] == "assistant" else ""
                )
                olen = count(reply) if reply and not output_len_given else int(o_lens[c, k])
                if not reply:
                    reply = synthetic_text(olen, text_rng, tokenizer)[0]
                rows.append((user, reply, olen))
        else:
            for k in range(turns):
                user = synthetic_text(int(p_lens[c, k]), text_rng, tokenizer)[0]
                olen = int(o_lens[c, k])
                rows.append((user, synthetic_text(olen, text_rng, tokenizer)[0], olen))
        plan.append(rows)
    specs: list[RequestSpec] = []
    last_id: dict[int, int] = {}
    for k in range(turns):
        for c in range(n_conv):
            if len(specs) == total:
                break
            history: list[tuple[str, str]] = []
            for user, reply, _ in plan[c][:k]:
                history += [("user", user), ("assistant", reply)]
            history.append(("user", plan[c][k][0]))
            text = _history_text(history)
            rid = len(specs)
            specs.append(
                RequestSpec(
                    request_id=rid,
                    prompt_tokens=count(text),
                    max_output_tokens=max(1, plan[c][k][2]),
                    prompt=text,
                    is_warmup=rid < warmup,
                    after=last_id.get(c),
                )
            )
            last_id[c] = rid
    return specs


def shared_prefix_prompts(
    n: int,
    prefix_tokens: int,
    suffix_tokens: Sequence[int],
    rng: np.random.Generator,
    tokenizer: Any | None = None,
    groups: int = 1,
) -> list[tuple[str, int]]:
    """``n`` prompts; those of one group share a prefix of ``prefix_tokens`` tokens, followed by
    a unique suffix of ``suffix_tokens[i]`` tokens. Returns (text, prompt tokens) pairs."""
    prefixes = [synthetic_text(prefix_tokens, rng, tokenizer) for _ in range(max(1, groups))]
    out = []
    for i in range(n):
        ptext, plen = prefixes[i % len(prefixes)]
        stext, slen = synthetic_text(int(suffix_tokens[i]), rng, tokenizer)
        text = f"{ptext} {stext}"
        total = _Tok(tokenizer).count(text) if tokenizer is not None else plen + slen
        out.append((text, total))
    return out


def build_dataset_specs(
    kind: str,
    *,
    n: int | None,
    warmup: int,
    prompt_lens: Any,
    output_lens: Any,
    seed: int,
    path: Path | None = None,
    prefix_len: int = 0,
    prefix_groups: int = 1,
    tokenizer: Any | None = None,
    output_len_given: bool = False,
    salt: int | None = None,
    turns: int = 3,
) -> list[RequestSpec]:
    """Requests with prompt text for ``kind`` (``synthetic``, ``sharegpt``, ``shared-prefix``).

    Args:
        n: measured requests (None: the dataset's size for ShareGPT, else 32).
        prompt_lens / output_lens: ``LengthDist``-like objects with ``sample(rng, k)``.
        output_len_given: the user fixed ``--output-len``; ShareGPT reply lengths then yield.
        turns: user turns per conversation (``multi-turn``).
        salt: varies the generated text (synthetic, shared-prefix) but not the lengths, so
            that each run sends prompts no server has cached; None repeats the text exactly.
    """
    if kind not in DATASET_KINDS:
        raise WorkloadError(f"unknown --dataset {kind!r}: use one of {', '.join(DATASET_KINDS)}")
    rng = np.random.default_rng(seed)
    if kind == "multi-turn":
        return multi_turn_specs(
            n if n is not None else 32,
            warmup,
            turns,
            prompt_lens,
            output_lens,
            rng,
            rng if salt is None else np.random.default_rng([seed, salt]),
            tokenizer,
            path,
            output_len_given,
        )
    if kind == "sharegpt":
        if path is None:
            raise WorkloadError("--dataset sharegpt needs a file: --dataset sharegpt:PATH")
        pairs = load_sharegpt(path)
        order = rng.permutation(len(pairs))
        count = n if n is not None else len(pairs)
        total = warmup + count
        out_lens = output_lens.sample(rng, total)
        specs = []
        for i in range(total):
            prompt, reply = pairs[int(order[i % len(pairs)])]
            plen = _Tok(tokenizer).count(prompt) if tokenizer else math.ceil(len(prompt) / 4)
            if reply and not output_len_given:
                olen = _Tok(tokenizer).count(reply) if tokenizer else math.ceil(len(reply) / 4)
            else:
                olen = int(out_lens[i])
            specs.append(
                RequestSpec(
                    request_id=i,
                    prompt_tokens=max(1, plen),
                    max_output_tokens=max(1, olen),
                    prompt=prompt,
                    is_warmup=i < warmup,
                )
            )
        return specs
    count = n if n is not None else 32
    total = warmup + count
    p_lens = prompt_lens.sample(rng, total)
    o_lens = output_lens.sample(rng, total)
    text_rng = rng if salt is None else np.random.default_rng([seed, salt])
    if kind == "shared-prefix":
        if prefix_len < 1:
            raise WorkloadError("--dataset shared-prefix needs --prefix-len P (tokens, >= 1)")
        prompts = shared_prefix_prompts(
            total, prefix_len, p_lens, text_rng, tokenizer, prefix_groups
        )
    else:
        prompts = [synthetic_text(int(k), text_rng, tokenizer) for k in p_lens]
    return [
        RequestSpec(
            request_id=i,
            prompt_tokens=plen,
            max_output_tokens=int(o_lens[i]),
            prompt=text,
            is_warmup=i < warmup,
        )
        for i, (text, plen) in enumerate(prompts)
    ]


def load_tokenizer_for(path: str | None, server_url: str | None = None) -> Any | None:
    """The ``tokenizers`` tokenizer at ``path`` (file or folder); else the server's own
    ``/tokenize`` at ``server_url`` when it has one; else None."""
    if path:
        return load_tokenizer(path)
    if server_url:
        return ServerTokenizer.probe(server_url)
    return None


class _Encoding:
    __slots__ = ("ids",)

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids


class ServerTokenizer:
    """The server's tokenizer through its ``POST /tokenize`` (vLLM and SGLang take
    ``prompt``, llama.cpp ``content``), for exact prompt lengths without a local tokenizer.
    Only ``encode(...).ids`` (token counts) is offered; one loopback request per call.

    Attributes:
        url: the ``/tokenize`` URL; key: the body field the server takes for the text.
    """

    def __init__(
        self, root_url: str, key: str, model: str | None = None, timeout_s: float = 30.0
    ) -> None:
        self.url = root_url.rstrip("/") + "/tokenize"
        self.key = key
        self.model = model
        self.timeout_s = timeout_s
        self.calls = 0

    @classmethod
    def probe(cls, root_url: str, model: str | None = None) -> ServerTokenizer | None:
        """A tokenizer for the server at ``root_url`` (without ``/v1``), or None when it has
        no usable ``/tokenize`` (or cannot be reached: the engine's preflight says why)."""
        for key in ("prompt", "content"):
            tok = cls(root_url, key, model, timeout_s=5.0)
            try:
                if len(tok.encode("Hello world").ids) > 0:
                    tok.timeout_s = 30.0
                    return tok
            except (OSError, ValueError):
                continue
        return None

    def encode(self, sequence: str, add_special_tokens: bool = False) -> _Encoding:
        import urllib.request

        body: dict[str, Any] = {self.key: sequence}
        body["add_special_tokens" if self.key == "prompt" else "add_special"] = add_special_tokens
        if self.model:
            body["model"] = self.model
        req = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
            data = json.loads(r.read())
        self.calls += 1
        ids = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(ids, list):
            raise ValueError("no 'tokens' in the /tokenize answer")
        return _Encoding([int(x) if isinstance(x, int) else 0 for x in ids])


def load_tokenizer(path: str | Path) -> Any:
    """A Hugging Face ``tokenizers`` tokenizer from ``tokenizer.json`` or a folder holding it."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise UsageError(
            f"--tokenizer {str(path)!r}: no tokenizer.json there; give the file or the model "
            "folder that holds it"
        )
    try:
        from tokenizers import Tokenizer
    except ImportError:  # pragma: no cover - tokenizers ships with the openai extra
        raise UsageError(
            "--tokenizer needs the 'tokenizers' package: pip install 'perfscope[openai]'"
        ) from None
    try:
        tok: Any = Tokenizer.from_file(str(p))
    except Exception as exc:
        raise UsageError(f"--tokenizer {str(p)!r}: cannot load it ({exc})") from None
    return tok
