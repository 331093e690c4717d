"""A request body, strictly: JSON without NaN/Infinity or deep nesting, then the route's Pydantic model;
what is wrong comes back as one ``ErrorBody`` that says what to fix."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from cdmpp.service.schemas import ErrorBody, ItemError

MAX_DEPTH = 64  # nesting of a request body (a workload+trace item needs ~8)


class BadBody(ValueError):
    """A request body that is not strict JSON; the message says where and why."""


def _no_constant(name: str):
    raise BadBody(f"{name} is not a JSON number (NaN and Infinity are not allowed)")


def _finite_float(text: str) -> float:
    x = float(text)
    if x != x or x in (float("inf"), float("-inf")):
        raise BadBody(f"number {text[:40]} is out of range (not a finite double)")
    return x


def _check_values(obj, path: str = "body") -> None:
    """Depth and strings of a parsed body: lone surrogates (``"\\ud800"``) cannot be encoded, and a
    deep structure would overflow the recursion of every later step."""
    stack = [(obj, path, 0)]
    while stack:
        x, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BadBody(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if isinstance(x, str):
            if not x.isascii():
                try:
                    x.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise BadBody(f"{where}: string holds a lone surrogate ({e.reason} at character {e.start})")
        elif isinstance(x, dict):
            for k, v in x.items():
                stack.append((k, f"{where} key", depth + 1))
                stack.append((v, f"{where}[{json.dumps(k, ensure_ascii=True)[:40]}]", depth + 1))
        elif isinstance(x, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(x))


def parse_body(raw: bytes):
    """Strict JSON: UTF-8, finite numbers, no lone surrogates, at most ``MAX_DEPTH`` levels."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadBody(f"body is not valid UTF-8 (byte {e.start}: {e.reason})") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise BadBody(f"body is not JSON: {e}") from None
    except RecursionError:
        raise BadBody(f"body is nested deeper than {MAX_DEPTH} levels") from None
    except BadBody:
        raise
    except ValueError as e:  # e.g. an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise BadBody(f"body holds a number that cannot be read: {str(e)[:200]}") from None
    _check_values(obj)
    return obj


def validated(model, raw: bytes):
    """A request body as ``model``, parsed strictly (``parse_body``); a 422 that says where, otherwise."""
    try:
        return model.model_validate(parse_body(raw))
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
