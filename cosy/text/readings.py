"""Numbers, dates, times and amounts of money as the words a person writes for them, in one language: what
SSML's `<say-as>` forces (`cosy.text.ssml_text.say_as`) and what a language hint reads numbers as
(`cosy.text.language.localize`). The words have no digits left, so the normalizer passes them through.

    cardinal("123", "zh")             # "一百二十三"
    date(2024, 5, 20, "en")           # "May twentieth, twenty twenty-four"
    time(14, 30, None, "de")          # "vierzehn Uhr dreißig"
    money("12.50", "EUR", "fr")       # "douze euros et cinquante centimes"

Languages: LANGUAGES. Chinese is spelled here (the readings wetext's zh FSTs give for dates and times, and the
cardinal of an integer, which wetext itself reads digit by digit when it stands alone: "123" -> 幺二三);
English numbers are the official spell-out's (`NumberSpeller`, inflect), its years, ordinals and money
num2words'; the other languages' number words are num2words' (Japanese in kanji numerals, Korean in Sino-Korean
numbers, with native hours).
"""
from __future__ import annotations

import functools
import re
from decimal import Decimal, InvalidOperation

__all__ = ["LANGUAGES", "cardinal", "digit_words", "date", "time", "money", "parse_number", "CURRENCY_SYMBOLS"]

LANGUAGES = ("zh", "en", "de", "es", "fr", "it", "ru", "ja", "ko")
# the languages that write a decimal comma (and a dot, blank or apostrophe between thousands)
DECIMAL_COMMA = frozenset({"de", "es", "fr", "it", "ru"})
CURRENCY_SYMBOLS = {"$": "USD", "€": "EUR", "£": "GBP", "¥": "CNY", "￥": "CNY", "₩": "KRW", "₽": "RUB",
                    "元": "CNY", "円": "JPY", "원": "KRW"}
CURRENCY_CODES = ("USD", "EUR", "GBP", "JPY", "CNY", "RMB", "KRW", "RUB")

_ZH_DIGITS = "零一二三四五六七八九"
_ZH_UNITS = ("", "十", "百", "千")
_ZH_GROUPS = ("", "万", "亿", "万亿")
_MONTHS = {
    "en": "January February March April May June July August September October November December".split(),
    "de": "Januar Februar März April Mai Juni Juli August September Oktober November Dezember".split(),
    "es": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre".split(),
    "fr": "janvier février mars avril mai juin juillet août septembre octobre novembre décembre".split(),
    "it": "gennaio febbraio marzo aprile maggio giugno luglio agosto settembre ottobre novembre dicembre".split(),
    "ru": "января февраля марта апреля мая июня июля августа сентября октября ноября декабря".split(),
}
_CURRENCY_NAMES = {  # the languages whose money num2words does not read: the unit after the amount
    "zh": {"USD": "美元", "EUR": "欧元", "GBP": "英镑", "JPY": "日元", "CNY": "元", "KRW": "韩元", "RUB": "卢布"},
    "ja": {"USD": "ドル", "EUR": "ユーロ", "GBP": "ポンド", "JPY": "円", "CNY": "元", "KRW": "ウォン",
           "RUB": "ルーブル"},
    "ko": {"USD": "달러", "EUR": "유로", "GBP": "파운드", "JPY": "엔", "CNY": "위안", "KRW": "원", "RUB": "루블"},
}
_CENTS_JOIN = {"en": " and", "de": " und", "es": " con", "fr": " et", "it": " e", "ru": ","}
_KO_NATIVE_HOURS = ("", "한", "두", "세", "네", "다섯", "여섯", "일곱", "여덟", "아홉", "열", "열한", "열두")
_NUMBER = re.compile(r"[+-−]?\d[\d\s.,'’]*")


def _check(lang: str) -> None:
    if lang not in LANGUAGES:
        raise ValueError(f"no readings for language {lang!r} (choose from {', '.join(LANGUAGES)})")


@functools.cache
def _speller():
    from cosy.text.normalize import NumberSpeller  # inflect, loaded once per process on first use
    return NumberSpeller()


def _n2w(value, lang: str, **kw) -> str:
    from num2words import num2words
    return num2words(value, lang=lang, **kw)


def parse_number(text: str, lang: str) -> Decimal | None:
    """A written number ("1,234.5", de "1.234,5", "-3") as a Decimal; None when it is not one."""
    s = text.strip().replace("−", "-").replace("’", "'")
    sign = -1 if s.startswith("-") else 1
    s = s.lstrip("+-").replace(" ", "").replace("\u00a0", "").replace("'", "")
    thousands, point = (".", ",") if lang in DECIMAL_COMMA else (",", ".")
    if s.count(point) > 1 or not s:
        return None
    whole, _, fraction = s.partition(point)
    if thousands in whole:
        groups = whole.split(thousands)
        if not (1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])):
            return None
        whole = "".join(groups)
    if not whole.isdigit() or fraction and not fraction.isdigit() or not whole.isascii():
        return None
    try:
        return sign * Decimal(f"{whole}.{fraction}" if fraction else whole)
    except InvalidOperation:
        return None


def _zh_integer(n: int) -> str:
    if n == 0:
        return "零"
    groups = []
    while n:
        groups.append(n % 10000)
        n //= 10000
    if len(groups) > len(_ZH_GROUPS):
        return "".join(_ZH_DIGITS[int(d)] for d in str(sum(g * 10000 ** i for i, g in enumerate(groups))))
    out, zero = "", False
    for i in range(len(groups) - 1, -1, -1):
        g = groups[i]
        if g == 0:
            zero = bool(out)
            continue
        part, gap = "", zero or (bool(out) and g < 1000)
        for k in range(3, -1, -1):
            d = g // 10 ** k % 10
            if d == 0:
                gap = gap or bool(part)
                continue
            if gap and (part or out):
                part += "零"
            gap = False
            part += _ZH_DIGITS[d] + _ZH_UNITS[k]
        out += part + _ZH_GROUPS[i]
        zero = g % 10 == 0
    if out.startswith("一十"):  # 十二, not 一十二
        out = out[1:]
    if out.startswith("二") and len(out) > 1 and out[1] in "千万亿":  # 两千, as wetext says a leading 2
        out = "两" + out[1:]
    return out


def cardinal(number: str | int | Decimal, lang: str) -> str:
    """The cardinal reading of a number (an int, a Decimal or a written number, `parse_number`); ValueError
    when the text is not a number."""
    _check(lang)
    value = number if isinstance(number, (int, Decimal)) else parse_number(str(number), lang)
    if value is None:
        raise ValueError(f"{number!r} is not a number")
    value = Decimal(value)
    sign, value = value < 0, abs(value)
    whole = int(value)
    fraction = format(value, "f").partition(".")[2].rstrip("0") if value != whole else ""
    if lang == "zh":
        words = _zh_integer(whole) + ("点" + "".join(_ZH_DIGITS[int(d)] for d in fraction) if fraction else "")
        return ("负" if sign else "") + words
    if lang == "en":
        words = _speller()(str(whole)) + (" point " + " ".join(digit_words(fraction, "en")) if fraction else "")
        return ("minus " if sign else "") + words
    # a float for a fraction: num2words reads some Decimals wrong (it: Decimal("3.14") -> "tre")
    number = float(f"{whole}.{fraction}") if fraction else whole
    return _n2w(-number if sign else number, lang)


def digit_words(text: str, lang: str, telephone: bool = False) -> list[str]:
    """Each ASCII digit of `text` as its word (a telephone's Chinese 1: 幺); other characters as they are."""
    _check(lang)
    out = []
    for c in text:
        if not (c.isdigit() and c.isascii()):
            out.append(c)
        elif lang == "zh":
            out.append("幺" if c == "1" and telephone else _ZH_DIGITS[int(c)])
        elif lang == "en":
            out.append(_speller()(c))
        else:
            out.append(_n2w(int(c), lang))
    return out


def _ordinal_day(day: int, lang: str) -> str:
    if lang == "en":
        return _n2w(day, "en", to="ordinal")
    if lang == "de":
        return _n2w(day, "de", to="ordinal") + "r"
    if lang == "ru":
        return _n2w(day, "ru", to="ordinal", gender="n")
    if lang in ("fr", "it", "es") and day == 1:
        return {"fr": "premier", "it": "primo", "es": "primero"}[lang]
    return _n2w(day, lang)


def _year(year: int, lang: str) -> str:
    if lang == "zh":
        return "".join(_ZH_DIGITS[int(d)] for d in str(year))
    if lang == "en":
        return _n2w(year, "en", to="year")
    if lang == "ru":
        return _n2w(year, "ru", to="ordinal", case="genitive") + " года"
    return cardinal(year, lang)


def date(year: int | None, month: int | None, day: int | None, lang: str) -> str:
    """A date (any part may be None) as words: zh 二零二四年五月二十日, en May twentieth, twenty twenty-four,
    de zwanzigster Mai zweitausendvierundzwanzig, fr vingt mai deux mille vingt-quatre, ja 二千二十四年五月二十日."""
    _check(lang)
    if lang in ("zh", "ja", "ko"):
        unit = {"zh": "年月日", "ja": "年月日", "ko": "년월일"}[lang]
        parts = []
        if year is not None:
            parts.append(_year(year, lang) + unit[0])
        if month is not None:
            parts.append({6: "유", 10: "시"}.get(month, cardinal(month, lang)) if lang == "ko"
                         else cardinal(month, lang))
            parts[-1] += unit[1]
        if day is not None:
            parts.append(cardinal(day, lang) + unit[2])
        return (" " if lang == "ko" else "").join(parts)
    name = _MONTHS[lang][month - 1] if month is not None else None
    y = _year(year, lang) if year is not None else None
    d = _ordinal_day(day, lang) if day is not None else None
    if lang == "en":
        head = " ".join(p for p in (name, d) if p)
        return f"{head}, {y}" if head and y and d else " ".join(p for p in (head, y) if p)
    if lang == "es":
        return " de ".join(p for p in (d, name, y) if p)
    return " ".join(p for p in (d, name, y) if p)


def _ru_plural(n: int, forms: tuple[str, str, str]) -> str:
    if n % 10 == 1 and n % 100 != 11:
        return forms[0]
    return forms[1] if 2 <= n % 10 <= 4 and not 12 <= n % 100 <= 14 else forms[2]


def time(hour: int, minute: int | None, second: int | None, lang: str, suffix: str = "") -> str:
    """A clock time as words: zh 十四点三十分, en two thirty, de vierzehn Uhr dreißig, fr quatorze heures
    trente, ko 열네 시 삼십 분. `suffix`: "AM"/"PM" as written (kept, English only)."""
    _check(lang)
    m, s = minute or 0, second or 0
    if lang == "zh":
        out = cardinal(hour, "zh") + "点"
        if m or s:
            out += ("零" if m < 10 else "") + cardinal(m, "zh") + "分"
        return out + (cardinal(s, "zh") + "秒" if s else "")
    if lang == "en":
        h = cardinal(hour, "en")
        out = h + (" o'clock" if not m and not s and not suffix else "" if not m else
                   " oh " + cardinal(m, "en") if m < 10 else " " + cardinal(m, "en"))
        out += f" and {cardinal(s, 'en')} seconds" if s else ""
        return out + (" " + suffix if suffix else "")
    if lang == "ja":
        return (cardinal(hour, "ja") + "時" + (cardinal(m, "ja") + "分" if m else "")
                + (cardinal(s, "ja") + "秒" if s else ""))
    if lang == "ko":
        h = _KO_NATIVE_HOURS[hour] if 1 <= hour <= 12 else (
            "스물" + _KO_NATIVE_HOURS[hour - 20] if hour > 20 else
            "스물" if hour == 20 else "열" + _KO_NATIVE_HOURS[hour - 10] if hour > 12 else cardinal(hour, "ko"))
        return " ".join([h + " 시"] + ([cardinal(m, "ko") + " 분"] if m else [])
                        + ([cardinal(s, "ko") + " 초"] if s else []))
    if lang == "ru":
        out = [cardinal(hour, "ru"), _ru_plural(hour, ("час", "часа", "часов"))]
        for value, forms in ((m, ("минута", "минуты", "минут")), (s, ("секунда", "секунды", "секунд"))):
            if value:
                out += [_n2w(value, "ru", gender="f"), _ru_plural(value, forms)]
        return " ".join(out)
    h = cardinal(hour, lang)
    mins = cardinal(m, lang) if m else ""
    secs = cardinal(s, lang) if s else ""
    if lang == "de":
        h = "ein" if hour == 1 else h
        return " ".join(p for p in (h, "Uhr", mins, f"und {secs} Sekunden" if secs else "") if p)
    if lang == "fr":
        h = "une" if hour == 1 else h
        return " ".join(p for p in (h, "heure" if hour == 1 else "heures", mins,
                                    f"et {secs} secondes" if secs else "") if p)
    if lang == "es":
        head = "la una" if hour == 1 else f"las {h}"
        return " y ".join(p for p in (head, mins, f"{secs} segundos" if secs else "") if p)
    head = "l'una" if hour == 1 else f"le {h}"  # it
    return " e ".join(p for p in (head, mins, f"{secs} secondi" if secs else "") if p)


def money(amount: str | Decimal, code: str, lang: str) -> str:
    """An amount of one currency (CURRENCY_CODES; RMB is CNY) as words: en twelve dollars and fifty cents, fr
    douze euros et cinquante centimes, zh 十二点五美元. ValueError when the amount is not a number or the
    language has no words for the currency."""
    _check(lang)
    code = "CNY" if code == "RMB" else code
    value = amount if isinstance(amount, Decimal) else parse_number(str(amount), lang)
    if value is None:
        raise ValueError(f"{amount!r} is not an amount")
    if lang in _CURRENCY_NAMES:
        return cardinal(value, lang) + ("" if lang != "ko" else " ") + _CURRENCY_NAMES[lang][code]
    value = value.quantize(Decimal("0.01"))
    try:
        words = _n2w(value, lang, to="currency", currency=code, separator="\0")
    except NotImplementedError:
        raise ValueError(f"no {lang} words for the currency {code}") from None
    whole, _, cents = words.partition("\0")
    return whole if value == int(value) else whole + _CENTS_JOIN[lang] + cents
