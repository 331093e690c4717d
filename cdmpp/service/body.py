"""A request body, strictly and within bounds: a JSON object without NaN/Infinity or deep nesting, whose
list of programs is read one item at a time and refused (413) at the first item over the batch limit,
and whose short fields (device, target, ...) are refused when over their length before they are decoded;
then the route's Pydantic model. What is wrong comes back as one ``ErrorBody`` that says what to fix.

Why by hand: ``json.loads`` builds every item of a 1,000,000-item list before anything can count them
(24 s, 3.9 GB and a 159 MB 422 in issue 53). Here the object's fields are walked with the C scanner of
the standard library (``scanstring``, ``raw_decode`` for one value), so at most ``max_items`` items ever
exist. The caller runs this in a worker thread, never on the event loop.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from itertools import chain
from json.decoder import scanstring

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from cdmpp.service.schemas import ErrorBody, ItemError

MAX_DEPTH = 64  # nesting of a request body (a workload+trace item needs ~8)
MAX_FIELDS = 16  # fields of the top-level object (the requests have 5 at most)
MAX_KEY = 64  # characters of a top-level field name

_WS = re.compile(r"[ \t\n\r]*")


class BadBody(ValueError):
    """A request body that is not strict JSON; the message says where and why."""


class TooManyItems(ValueError):
    """The list field holds more items than allowed (a 413, not a 422)."""


def _no_constant(name: str):
    raise BadBody(f"{name} is not a JSON number (NaN and Infinity are not allowed)")


def _finite_float(text: str) -> float:
    x = float(text)
    if x != x or x in (float("inf"), float("-inf")):
        raise BadBody(f"number {text[:40]} is out of range (not a finite double)")
    return x


_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def _check_value(obj, where: str) -> None:
    """Depth and strings of one decoded value: lone surrogates (``"\\ud800"``) cannot be encoded, and a
    deep structure would overflow the recursion of every later step. Walks with one iterator per level
    (at most ``MAX_DEPTH``), so a flat list of millions of values costs no extra memory."""
    stack = [iter((obj,))]
    while stack:
        for x in stack[-1]:
            if isinstance(x, str):
                if not x.isascii():
                    try:
                        x.encode("utf-8")
                    except UnicodeEncodeError as e:
                        raise BadBody(f"{where}: a string holds a lone surrogate ({e.reason} at character "
                                      f"{e.start})") from None
            elif isinstance(x, (dict, list)):
                if len(stack) > MAX_DEPTH:
                    raise BadBody(f"{where}: nested deeper than {MAX_DEPTH} levels")
                stack.append(chain.from_iterable(x.items()) if isinstance(x, dict) else iter(x))
                break
        else:
            stack.pop()


def _value(text: str, i: int, where: str):
    """One JSON value at ``text[i]`` (C scanner): (value, end)."""
    try:
        v, end = _DECODER.raw_decode(text, i)
    except json.JSONDecodeError as e:
        raise BadBody(f"{where}: not JSON: {e}") from None
    except RecursionError:
        raise BadBody(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except BadBody as e:
        raise BadBody(f"{where}: {e}") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise BadBody(f"{where}: holds a number that cannot be read: {str(e)[:200]}") from None
    _check_value(v, where)
    return v, end


def _short_string(text: str, i: int, name: str, limit: int):
    """A string field of at most ``limit`` characters, refused by its raw length before it is decoded
    (an escape takes at most 6 characters), so a 15 MiB device id is never built, compared or echoed."""
    if text.startswith('"', i) and _string_of_at_most(limit).match(text, i) is None:
        raise BadBody(f"{name}: longer than {limit} characters")
    v, end = _value(text, i, name)
    if isinstance(v, str) and len(v) > limit:
        raise BadBody(f"{name}: longer than {limit} characters")
    return v, end


@lru_cache(maxsize=8)
def _string_of_at_most(limit: int) -> re.Pattern:
    """A JSON string of at most ``limit`` characters, measured raw (an escape is at most 6 of them)."""
    return re.compile(r'"(?:[^"\\]|\\.){0,%d}"' % (6 * limit), re.S)


def _items(text: str, i: int, name: str, max_items: int):
    """The list at ``text[i]`` ("["), item by item; ``TooManyItems`` before item ``max_items + 1`` is decoded."""
    out: list = []
    i = _WS.match(text, i + 1).end()
    if text.startswith("]", i):
        return out, i + 1
    while True:
        if len(out) >= max_items:
            raise TooManyItems(f"{name}: more than {max_items}")
        v, i = _value(text, i, f"{name}[{len(out)}]")
        out.append(v)
        i = _WS.match(text, i).end()
        c = text[i:i + 1]
        if c == "]":
            return out, i + 1
        if c != ",":
            raise BadBody(f"{name}: expected ',' or ']' after item {len(out) - 1} (character {i})")
        i = _WS.match(text, i + 1).end()


def parse_body(raw: bytes, list_field: str | None = None, max_items: int = 1 << 62,
               short: dict[str, int] | None = None) -> dict:
    """Strict JSON object: UTF-8, finite numbers, no lone surrogates, at most ``MAX_DEPTH`` levels, no
    field twice; ``list_field`` (a list) holds at most ``max_items`` items (``TooManyItems``) and each
    field of ``short`` is a string of at most that many characters."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadBody(f"body is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    short = short or {}
    i = _WS.match(text).end()
    if not text.startswith("{", i):
        raise BadBody("body is not a JSON object")
    out: dict = {}
    i = _WS.match(text, i + 1).end()
    if text.startswith("}", i):
        i += 1
    else:
        while True:
            if not text.startswith('"', i):
                raise BadBody(f"body: expected a field name in double quotes (character {i})")
            if _string_of_at_most(MAX_KEY).match(text, i) is None:
                raise BadBody(f"body: a field name is longer than {MAX_KEY} characters (character {i})")
            try:
                key, i = scanstring(text, i + 1, True)
            except json.JSONDecodeError as e:
                raise BadBody(f"body: not JSON: {e}") from None
            _check_value(key, "body: a field name")
            if len(key) > MAX_KEY:
                raise BadBody(f"body: a field name is longer than {MAX_KEY} characters (character {i})")
            if key in out:
                raise BadBody(f"body: field {key!r} given twice")
            if len(out) >= MAX_FIELDS:
                raise BadBody(f"body: more than {MAX_FIELDS} fields")
            i = _WS.match(text, i).end()
            if not text.startswith(":", i):
                raise BadBody(f"body: expected ':' after {key!r} (character {i})")
            i = _WS.match(text, i + 1).end()
            if key == list_field and text.startswith("[", i):
                out[key], i = _items(text, i, key, max_items)
            elif key in short:
                out[key], i = _short_string(text, i, key, short[key])
            else:
                out[key], i = _value(text, i, key)
            i = _WS.match(text, i).end()
            c = text[i:i + 1]
            if c == "}":
                i += 1
                break
            if c != ",":
                raise BadBody(f"body: expected ',' or '}}' after {key!r} (character {i})")
            i = _WS.match(text, i + 1).end()
    if _WS.match(text, i).end() != len(text):
        raise BadBody(f"body: extra data after the JSON object (character {i})")
    return out


def validated(model, raw: bytes, list_field: str | None = None, max_items: int = 1 << 62):
    """A request body as ``model``, parsed strictly (``parse_body``; a field with a ``max_length`` in the
    model is a short string, refused by its raw length); a 422 that says where, or a 413 over ``max_items``."""
    short = {k: m.max_length for k, f in model.model_fields.items() if k != list_field
             for m in f.metadata if getattr(m, "max_length", None) is not None}
    try:
        return model.model_validate(parse_body(raw, list_field, max_items, short))
    except TooManyItems as e:
        raise ApiError(413, ErrorBody(detail=f"{e} {list_field} in one request, over the limit of {max_items} "
                                             "(CDMPP_MAX_BATCH); split it", limit=max_items))
    except BadBody as e:
        raise ApiError(422, ErrorBody(detail=str(e)))
    except ValidationError as e:
        raise ApiError(422, validation_errors(e.errors(include_input=False)))


def validation_errors(errors) -> ErrorBody:
    """pydantic errors as an ErrorBody; item errors keep their index; never echoes the input."""
    by_item: dict[int, list[str]] = {}
    lines = []
    for e in errors:
        loc = [str(x) for x in e.get("loc", ()) if x != "body"]
        lines.append(f"{'.'.join(loc) or 'body'}: {e.get('msg', 'invalid')}")
        if len(loc) >= 2 and loc[0] == "programs" and loc[1].isdigit():  # one entry per item, however
            by_item.setdefault(int(loc[1]), []).append(e.get("msg", "invalid"))  # many union members failed
    items = [ItemError(index=i, reason="not a program (TVMScript/JSON text or a workload+trace object): "
                                       + "; ".join(dict.fromkeys(r))) for i, r in sorted(by_item.items())]
    return ErrorBody(detail="invalid request: " + "; ".join(lines[:5]), errors=items or None)


def error_response(status: int, body: ErrorBody, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(body.model_dump(exclude_none=True), status_code=status, headers=headers)


class ApiError(Exception):
    """An error with a status code and an ``ErrorBody``; the app's handler turns it into a response."""

    def __init__(self, status: int, body: ErrorBody, headers: dict | None = None):
        self.status, self.body, self.headers = status, body, headers
