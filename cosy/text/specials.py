"""The CosyVoice special tokens each family's tokenizer appends after the Qwen2 base specials, in the official
order (`ModelFamily.text_specials` names one of these tuples).

CosyVoice2: 17 tokens, `<|endofprompt|>` 151646 .. `[mn]` 151662 (length 151663).
CosyVoice3: the same 17, `<|endofsystem|>` 151663, then 260 phoneme tokens 151664 .. 151923 (length 151924):
English ARPAbet phones (vowels bare and with stress 0/1/2) and pinyin initials and tonal finals, all in
brackets, sorted by their text as the official list is.
"""
from __future__ import annotations

COSYVOICE2: tuple[str, ...] = (
    "<|endofprompt|>", "[breath]", "<strong>", "</strong>", "[noise]", "[laughter]", "[cough]",
    "[clucking]", "[accent]", "[quick_breath]", "<laughter>", "</laughter>", "[hissing]", "[sigh]",
    "[vocalized-noise]", "[lipsmack]", "[mn]",
)

_ARPABET_VOWELS = "AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split()
_ARPABET_CONSONANTS = "B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split()
_PINYIN = (
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng ióng "
    "iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u uang ue un uo "
    "uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x "
    "y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í ín íng ò òng òu ó óng óu ù "
    "ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu "
    "ǔ ǔn ǘ ǚ ǜ"
).split()
PHONEMES: tuple[str, ...] = tuple(f"[{p}]" for p in sorted(
    [v + s for v in _ARPABET_VOWELS for s in ("", "0", "1", "2")] + _ARPABET_CONSONANTS + _PINYIN))

COSYVOICE3: tuple[str, ...] = COSYVOICE2 + ("<|endofsystem|>",) + PHONEMES

assert len(PHONEMES) == 260 and len(COSYVOICE3) == 278

__all__ = ["COSYVOICE2", "COSYVOICE3", "PHONEMES"]
