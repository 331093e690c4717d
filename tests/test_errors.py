"""``error_message``: the one line a user reads from an exception."""

from cdmpp.errors import error_message


def test_a_tvmscript_diagnostic_gives_its_error_line_and_location():
    e = SyntaxError("error: name 'x' is not defined\n --> <str>:3:9\n   |\n 3 |  x = 1")
    assert error_message(e) == "name 'x' is not defined (at <str>:3:9)"


def test_a_tvm_error_gives_its_last_lines():
    e = RuntimeError("Traceback:\n  File a\n  File b\nInternalError: Check failed: x == y")
    assert error_message(e) == "InternalError: Check failed: x == y"
    assert error_message(e, lines=2) == "File b | InternalError: Check failed: x == y"


def test_an_empty_error_is_named_by_its_type_and_a_message_is_cut():
    assert error_message(ValueError()) == "ValueError"
    assert error_message("") == "unknown error"
    assert len(error_message("x" * 1000, limit=50)) == 50
