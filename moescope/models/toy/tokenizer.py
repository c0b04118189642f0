"""The toy model's character-level tokenizer.

One token per character of :data:`moescope.models.tasks.ALPHABET` plus four specials, so every task
string tokenizes the same way in training, generation and scoring, and decoding is the exact
inverse of encoding. It is a stock ``tokenizers`` WordLevel model that
``AutoTokenizer.from_pretrained`` loads without moescope.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from moescope.models.tasks import ALPHABET

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedTokenizerFast

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
"""Special tokens; their ids are 0, 1, 2, 3 in this order."""

PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(len(SPECIALS))
VOCAB_SIZE = len(SPECIALS) + len(ALPHABET)


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the tokenizer: ``<bos>`` prepended, one id per character, left padding.

    Left padding is what batched generation needs; training code that wants right padding
    pads by hand.

    Example
    -------
    >>> tok = build_tokenizer()
    >>> tok.decode(tok("12+34=").input_ids, skip_special_tokens=True)
    '12+34='
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate((*SPECIALS, *ALPHABET))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per char
    core.decoder = decoders.Fuse()  # join characters back without spaces
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", BOS_ID)])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="left",
    )
