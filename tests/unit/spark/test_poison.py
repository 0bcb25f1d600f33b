"""How a record the transform cannot compute is named: by the Python exception a UDF raised, or
by the Spark SQL error's condition, with the exception's classes after it for classifiers."""

from __future__ import annotations

from redrive.policy import error_type
from redrive.spark.poison import error_of


class PythonException(Exception):
    """Spark's name for a Python worker's error, whose text ends with the worker's traceback."""


class NumberFormatException(Exception):
    def getCondition(self) -> str:
        return "CAST_INVALID_INPUT"


class Gone(Exception):
    def getCondition(self) -> str:
        raise RuntimeError("the JVM side is gone")


UDF_TRACE = """
  An exception was thrown from the Python worker. Please see the stack trace below.
Traceback (most recent call last):
  File "/work/udf.py", line 3, in checked
    raise KeyError("sku")
ValueError: cannot check boom: KeyError: 'sku'
"""


def test_a_udf_error_is_named_by_the_python_exception_it_raised() -> None:
    error = error_of(PythonException(UDF_TRACE))
    assert (error.type_name, error.message) == ("ValueError", "cannot check boom: KeyError: 'sku'")
    assert error.trace == str(PythonException(UDF_TRACE))
    assert error_type(ValueError).matches(error)
    assert error_type("PythonException").matches(error)
    assert not error_type(KeyError).matches(error)


def test_a_sql_error_is_named_by_its_condition() -> None:
    text = "[CAST_INVALID_INPUT] The value 'abc' of the type \"STRING\" cannot be cast.\n\tat jvm"
    error = error_of(NumberFormatException(text))
    assert error.type_name == "CAST_INVALID_INPUT"
    assert error.message == "[CAST_INVALID_INPUT] The value 'abc' of the type \"STRING\" " \
                            "cannot be cast."
    assert error_type("CAST_INVALID_INPUT").matches(error)
    assert error_type("NumberFormatException").matches(error)
    assert error.chain[0][0] == "CAST_INVALID_INPUT"


def test_without_a_condition_the_class_names_it() -> None:
    error = error_of(Gone("lost"))
    assert error.type_name.endswith("Gone") and error.message == "lost"
    assert error_of(PythonException("no traceback here")).type_name.endswith("PythonException")


def test_a_long_trace_is_cut() -> None:
    error = error_of(NumberFormatException("x" * 20_000))
    assert len(error.trace) == 8_000 and len(error.message) == 20_000
