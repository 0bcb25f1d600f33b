/* The header contract's two per-failure steps in C: reading a copy's history and writing a
 * copy's headers (redrive.headers has the reference versions and calls these first).
 *
 * Each handles the common case and answers None for anything else, so that headers.py takes
 * the record through its own code and raises its own errors: a value that is not plain ASCII
 * digits, text that is not UTF-8, an empty group or topic, a partial origin, headers in another
 * shape than a list of (str, bytes) pairs. The tests hold both versions to the same results.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Bound once, when the module is imported (bind_record_types). */
static PyObject *delivery_type, *origin_type, *no_history;
static PyObject *delivery_fields[6], *origin_fields[4];

enum { ATTEMPT, DUE, PARTITION, OFFSET, TIMESTAMP, FIRST_FAILURE, TOPIC, GROUP, TARGET, KNOWN };
#define INTEGERS 6 /* the first six are decimal integers */

#define PREFIX "redrive-"
#define PREFIX_LEN 8

/* Which of redrive's headers `rest` (the name after "redrive-") is; -1 for another. */
static int known_header(const char *rest, Py_ssize_t len)
{
#define IS(text) (len == (Py_ssize_t)sizeof(text) - 1 && memcmp(rest, text, len) == 0)
    switch (rest[0]) {
    case 'a': return IS("attempt") ? ATTEMPT : -1;
    case 'd': return IS("due") ? DUE : -1;
    case 'f': return IS("first-failure") ? FIRST_FAILURE : -1;
    case 'g': return IS("group") ? GROUP : -1;
    case 't': return IS("target") ? TARGET : -1;
    case 'o':
        if (IS("original-topic")) return TOPIC;
        if (IS("original-partition")) return PARTITION;
        if (IS("original-offset")) return OFFSET;
        if (IS("original-timestamp")) return TIMESTAMP;
        return -1;
    default: return -1;
    }
#undef IS
}

/* The largest value of each integer header, as headers.py's _LIMITS gives them. */
static const uint64_t LIMITS[INTEGERS] = {
    [ATTEMPT] = INT32_MAX, [DUE] = 253402300799999ULL, [PARTITION] = INT32_MAX,
    [OFFSET] = INT64_MAX, [TIMESTAMP] = 253402300799999ULL, [FIRST_FAILURE] = 253402300799999ULL,
};

/* 1 to 19 ASCII digits as an int up to `limit`; NULL without an error set for anything else. */
static PyObject *whole_number(PyObject *raw, uint64_t limit)
{
    Py_ssize_t len = PyBytes_GET_SIZE(raw);
    const char *digits = PyBytes_AS_STRING(raw);
    uint64_t value = 0;
    if (len < 1 || len > 19)
        return NULL;
    for (Py_ssize_t i = 0; i < len; i++) {
        if (digits[i] < '0' || digits[i] > '9')
            return NULL;
        value = value * 10 + (uint64_t)(digits[i] - '0'); /* 19 digits fit in 64 bits */
    }
    if (value > limit)
        return NULL;
    return PyLong_FromUnsignedLongLong(value);
}

/* UTF-8 text as str; NULL without an error set if it is not UTF-8. */
static PyObject *text(PyObject *raw)
{
    PyObject *out = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), NULL);
    if (out == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return out;
}

/* A frozen dataclass with slots, built by storing its fields past its refusing __setattr__. */
static PyObject *build(PyObject *type, PyObject **names, PyObject **values, int count)
{
    PyObject *out = ((PyTypeObject *)type)->tp_alloc((PyTypeObject *)type, 0);
    if (out == NULL)
        return NULL;
    for (int i = 0; i < count; i++) {
        if (PyObject_GenericSetAttr(out, names[i], values[i]) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* redrive.record's Delivery, Origin and NO_HISTORY, and the names of their fields. */
static int bind_record_types(void)
{
    static const char *delivery_names[6] = {"attempt", "first_failure_ms", "group", "original",
                                            "due_ms", "target"};
    static const char *origin_names[4] = {"topic", "partition", "offset", "timestamp_ms"};
    PyObject *record = PyImport_ImportModule("redrive.record");
    if (record == NULL)
        return -1;
    delivery_type = PyObject_GetAttrString(record, "Delivery");
    origin_type = PyObject_GetAttrString(record, "Origin");
    no_history = PyObject_GetAttrString(record, "NO_HISTORY");
    Py_DECREF(record);
    if (delivery_type == NULL || origin_type == NULL || no_history == NULL)
        return -1;
    if (!PyType_Check(delivery_type) || !PyType_Check(origin_type)) {
        PyErr_SetString(PyExc_TypeError, "redrive.record's Delivery and Origin must be classes");
        return -1;
    }
    for (int i = 0; i < 6; i++)
        if ((delivery_fields[i] = PyUnicode_InternFromString(delivery_names[i])) == NULL)
            return -1;
    for (int i = 0; i < 4; i++)
        if ((origin_fields[i] = PyUnicode_InternFromString(origin_names[i])) == NULL)
            return -1;
    return 0;
}

static PyObject *read_delivery(PyObject *module, PyObject *headers)
{
    if (!PyList_CheckExact(headers))
        Py_RETURN_NONE;
    /* Borrowed: the list's pairs hold them for this call. The last of each name wins. */
    PyObject *raw[KNOWN] = {NULL};
    int found = 0;
    Py_ssize_t count = PyList_GET_SIZE(headers);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *pair = PyList_GET_ITEM(headers, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2)
            Py_RETURN_NONE;
        PyObject *name = PyTuple_GET_ITEM(pair, 0);
        if (!PyUnicode_CheckExact(name))
            Py_RETURN_NONE;
        Py_ssize_t len;
        const char *chars = PyUnicode_AsUTF8AndSize(name, &len);
        if (chars == NULL) {
            PyErr_Clear(); /* a name that is not text (lone surrogates): the Python way */
            Py_RETURN_NONE;
        }
        if (len < PREFIX_LEN || memcmp(chars, PREFIX, PREFIX_LEN) != 0)
            continue;
        found = 1;
        int which = known_header(chars + PREFIX_LEN, len - PREFIX_LEN);
        if (which < 0)
            continue;
        PyObject *value = PyTuple_GET_ITEM(pair, 1);
        if (!PyBytes_CheckExact(value))
            Py_RETURN_NONE;
        raw[which] = value;
    }
    if (!found)
        return Py_NewRef(no_history);

    PyObject *value[KNOWN] = {NULL};
    PyObject *result = NULL, *origin = NULL;
    for (int i = 0; i < KNOWN; i++) {
        if (raw[i] == NULL) {
            value[i] = Py_NewRef(Py_None);
            continue;
        }
        value[i] = i < INTEGERS ? whole_number(raw[i], LIMITS[i]) : text(raw[i]);
        if (value[i] == NULL)
            goto done; /* an error, or a value headers.py must judge */
        if (i >= INTEGERS && PyUnicode_GET_LENGTH(value[i]) == 0)
            goto done; /* an empty name: headers.py raises for it */
    }
    if (raw[TOPIC] != NULL || raw[PARTITION] != NULL || raw[OFFSET] != NULL) {
        if (raw[TOPIC] == NULL || raw[PARTITION] == NULL || raw[OFFSET] == NULL)
            goto done; /* a partial origin: headers.py raises for it */
        PyObject *fields[4] = {value[TOPIC], value[PARTITION], value[OFFSET], value[TIMESTAMP]};
        origin = build(origin_type, origin_fields, fields, 4);
        if (origin == NULL)
            goto done;
    }
    if (raw[ATTEMPT] == NULL)
        Py_SETREF(value[ATTEMPT], PyLong_FromLong(0));
    if (value[ATTEMPT] == NULL)
        goto done;
    PyObject *fields[6] = {value[ATTEMPT], value[FIRST_FAILURE], value[GROUP],
                           origin != NULL ? origin : Py_None, value[DUE], value[TARGET]};
    result = build(delivery_type, delivery_fields, fields, 6);
done:
    /* No result and no error: a case headers.py reads and judges itself. */
    if (result == NULL && !PyErr_Occurred())
        result = Py_NewRef(Py_None);
    for (int i = 0; i < KNOWN; i++)
        Py_XDECREF(value[i]);
    Py_XDECREF(origin);
    return result;
}

/* An update's value as headers.replace writes it: bytes as they are, anything else as the
 * UTF-8 of its str(). */
static PyObject *encoded(PyObject *value)
{
    if (PyBytes_CheckExact(value))
        return Py_NewRef(value);
    if (PyUnicode_CheckExact(value))
        return PyUnicode_AsUTF8String(value);
    if (PyLong_CheckExact(value)) {
        int overflow;
        long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow) {
            if (number == -1 && PyErr_Occurred())
                return NULL;
            char digits[24];
            int len = snprintf(digits, sizeof digits, "%lld", number);
            return PyBytes_FromStringAndSize(digits, len);
        }
    }
    PyObject *shown = PyObject_Str(value);
    if (shown == NULL)
        return NULL;
    PyObject *out = PyUnicode_AsUTF8String(shown);
    Py_DECREF(shown);
    return out;
}

/* An update value encoded() turns into bytes without running Python code. */
static int plain_value(PyObject *value)
{
    return value == Py_None || PyBytes_CheckExact(value) || PyUnicode_CheckExact(value)
        || PyLong_CheckExact(value) || PyBool_Check(value);
}

static PyObject *replace(PyObject *module, PyObject *args)
{
    PyObject *headers, *updates;
    if (!PyArg_ParseTuple(args, "OO:replace", &headers, &updates))
        return NULL;
    if (!PyList_CheckExact(headers) || !PyDict_CheckExact(updates))
        Py_RETURN_NONE;
    /* With str keys and plain values, neither a lookup's __eq__ nor an encoding's __str__ can
     * run code that changes the list or the dict under the loops; headers.py takes the rest. */
    Py_ssize_t position = 0;
    PyObject *name, *value;
    while (PyDict_Next(updates, &position, &name, &value))
        if (!PyUnicode_CheckExact(name) || !plain_value(value))
            Py_RETURN_NONE;
    /* An allocation may still start a collection whose finalizers change either: the loops hold
     * what they use, and a change of size leaves the call to headers.py. */
    Py_ssize_t count = PyList_GET_SIZE(headers), size = PyDict_GET_SIZE(updates);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (PyList_GET_SIZE(headers) != count || PyDict_GET_SIZE(updates) != size)
            goto to_python;
        PyObject *pair = Py_NewRef(PyList_GET_ITEM(headers, i));
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2
                || !PyUnicode_CheckExact(PyTuple_GET_ITEM(pair, 0))) {
            Py_DECREF(pair);
            goto to_python;
        }
        int named = PyDict_Contains(updates, PyTuple_GET_ITEM(pair, 0));
        /* A kept pair is immutable: the copy shares it rather than building it again. */
        int failed = named < 0 || (!named && PyList_Append(out, pair) < 0);
        Py_DECREF(pair);
        if (failed) {
            Py_DECREF(out);
            return NULL;
        }
    }
    position = 0;
    while (PyDict_Next(updates, &position, &name, &value)) {
        if (value == Py_None)
            continue;
        Py_INCREF(name);
        Py_INCREF(value);
        PyObject *bytes = PyUnicode_CheckExact(name) && plain_value(value) ? encoded(value)
                                                                            : NULL;
        PyObject *pair = bytes == NULL ? NULL : PyTuple_Pack(2, name, bytes);
        Py_DECREF(name);
        Py_DECREF(value);
        Py_XDECREF(bytes);
        if (pair == NULL || PyList_Append(out, pair) < 0) {
            Py_XDECREF(pair);
            if (!PyErr_Occurred())
                goto to_python;
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(pair);
        if (PyDict_GET_SIZE(updates) != size)
            goto to_python;
    }
    return out;
to_python:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"read_delivery", read_delivery, METH_O,
     "read_delivery(headers) -> Delivery, or None where headers.py must read them itself."},
    {"replace", replace, METH_VARARGS,
     "replace(headers, updates) -> list, or None where headers.py must build it itself."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "redrive._headers",
    "The header contract's common case in C (see redrive.headers).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__headers(void)
{
    if (bind_record_types() < 0)
        return NULL;
    return PyModule_Create(&module_def);
}
