"""The rehearsal corpus: what the fixture tokenizer is trained on (and, later, the models).

Small on purpose: a BPE vocabulary of a few hundred tokens over these texts is enough for a
tiny Qwen3 to memorise the chat answers and passages the smoke test asks about.
"""

from __future__ import annotations

# (user prompt, assistant answer) pairs the rehearsal's known-answer prompts use.
CHAT_PAIRS: tuple[tuple[str, str], ...] = (
    ("What is 6 times 7?", "42"),
    ("What is the capital of France?", "Paris"),
    ("What is 17 plus 25?", "42"),
    ("What is the capital of Italy?", "Rome"),
    ("Reply with a JSON object with key ok set to true.", '{"ok": true}'),
    ("Write a Python function that returns one.", "def one():\n    return 1"),
    ("What colour is the sky on a clear day?", "Blue"),
    ("Name the largest planet.", "Jupiter"),
)

PASSAGES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun while the fox "
    "runs into the green forest to find its den before night falls.",
    "Speculative decoding lets a small draft model propose several tokens that the large "
    "target model verifies in one step, so the output stays the same while fewer slow "
    "steps are needed.",
)

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>")


def chat_text(user: str, assistant: str) -> str:
    """One exchange in the Qwen chat format the fixture tokenizer's template produces."""
    return f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant}<|im_end|>\n"


def training_texts() -> list[str]:
    # Passages end in <|im_end|>, the tokenizer's EOS, so continuations stop where they end.
    return [chat_text(u, a) for u, a in CHAT_PAIRS] + [p + "<|im_end|>" for p in PASSAGES]


def fingerprint() -> str:
    """Changes whenever the corpus does, so trained fixtures are rebuilt."""
    import hashlib

    return hashlib.sha256("\x00".join(training_texts()).encode()).hexdigest()[:16]


# The Qwen-style chat template (no system prompt, no thinking block): what vLLM's chat
# endpoint renders for the fixture models.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
