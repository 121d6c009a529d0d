"""A sentencepiece model re-numbered to another toolkit's vocabulary, with this toolkit's special ids.

Marian (and Hugging Face's ``MarianTokenizer``) cut text with a sentencepiece model into pieces, then look
each piece up in a separate vocabulary (``vocab.json``): the id a model was trained on is the vocabulary's,
not the sentencepiece model's. Our :class:`~app.data.tokenizer.Tokenizer` reads ids straight from the
sentencepiece model and fixes pad 0, unk 1, bos 2, eos 3. :func:`renumbered_model` rewrites the model's
piece list into the order of a given vocabulary, so that ids come out in that order and the same text is
cut into the same pieces:

- each piece keeps its score and type, so segmentation is unchanged;
- a vocabulary entry the model lacks (the other side's pieces of a joint vocabulary) becomes an UNUSED
  piece: it holds its id but is never produced;
- a piece the vocabulary lacks is dropped (Marian would map it to unk; we report how many);
- ids 0-3 are our specials, whatever the vocabulary calls the entries placed there;
- named vocabulary entries the model lacks become user-defined pieces (always one token), e.g. the
  target-language tokens ``>>fra<<`` of multilingual OPUS-MT models: each is written with the word-boundary
  mark before it (``▁>>fra<<``), so that ``>>fra<< The house`` is cut ``▁>>fra<<``, ``▁The``, ``▁house``:
  the token takes the boundary sentencepiece puts before the text, as Hugging Face's ``MarianTokenizer``,
  which splits the token off before sentencepiece, has it. A plain ``>>fra<<`` symbol would leave that
  boundary as an extra ``▁`` piece in front.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from sentencepiece import sentencepiece_model_pb2 as spm_pb2

from app.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SPECIAL_PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}
_Piece = spm_pb2.ModelProto.SentencePiece
WORD_START = "\u2581"  # sentencepiece's word-boundary mark


@dataclass(frozen=True)
class Renumbered:
    """A rewritten sentencepiece model and what the rewrite could not keep."""

    model: bytes  # the serialized ModelProto
    dropped: tuple[str, ...]  # the model's pieces that the vocabulary lacks (never produced now)
    unused: int  # vocabulary entries the model cannot produce (held as UNUSED pieces)
    symbols: tuple[str, ...] = ()  # vocabulary entries made user-defined pieces (``▁`` + the entry)


def renumbered_model(model_proto: bytes, pieces: list[str], symbols: Collection[str] = ()) -> Renumbered:
    """``model_proto`` with piece ``i`` = ``pieces[i]``; ``pieces[0:4]`` stand for our specials.

    ``pieces`` lists the vocabulary in our id order (strings unique); its first four entries are replaced
    by :data:`SPECIAL_PIECES` (the caller put there the entries that play those parts). Entries named in
    ``symbols`` that the model lacks become user-defined pieces ``▁`` + entry (see the module docstring).
    """
    if len(set(pieces[4:])) != len(pieces) - 4:
        raise ValueError("the vocabulary lists a piece twice: cannot number pieces by it")
    proto = spm_pb2.ModelProto()
    proto.ParseFromString(model_proto)
    kept = {p.piece: p for p in proto.pieces if p.type in (_Piece.NORMAL, _Piece.USER_DEFINED)}
    wanted = set(symbols)
    symbol_ids = {i for i in range(4, len(pieces)) if pieces[i] in wanted and pieces[i] not in kept}
    made = tuple(pieces[i] for i in sorted(symbol_ids))
    names = [SPECIAL_PIECES[i] if i < 4 else pieces[i] for i in range(len(pieces))]
    names = [WORD_START + name if i in symbol_ids else name for i, name in enumerate(names)]
    if len(set(names)) != len(names):
        raise ValueError(f"the vocabulary uses a special name {sorted(SPECIAL_PIECES.values())} for a piece")
    del proto.pieces[:]
    unused = 0
    for index, name in enumerate(names):
        piece = proto.pieces.add()
        piece.piece = name
        if index < 4:
            piece.type = _Piece.UNKNOWN if index == UNK_ID else _Piece.CONTROL
            piece.score = 0.0
        elif name in kept:
            piece.type, piece.score = kept[name].type, kept[name].score
        elif index in symbol_ids:
            piece.type, piece.score = _Piece.USER_DEFINED, 0.0
        else:
            piece.type, piece.score = _Piece.UNUSED, 0.0
            unused += 1
    spec = proto.trainer_spec
    spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    spec.pad_piece, spec.unk_piece = SPECIAL_PIECES[PAD_ID], SPECIAL_PIECES[UNK_ID]
    spec.bos_piece, spec.eos_piece = SPECIAL_PIECES[BOS_ID], SPECIAL_PIECES[EOS_ID]
    spec.vocab_size = len(names)
    dropped = tuple(sorted(set(kept) - set(names)))
    return Renumbered(model=proto.SerializeToString(), dropped=dropped, unused=unused, symbols=made)
