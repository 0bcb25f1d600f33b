/* redrive.consumer._plainrun: redrive.consumer.plain.handle_plain in C.
 *
 * The consumer's common case is a run of one partition's records without headers, each handed
 * to the user's handler as a Record. Done by the interpreter, building the Record (eight stores
 * and a class switch) and the loop's own bytecode cost about as much as a raw confluent-kafka
 * loop's whole per-record work; here the Record is filled directly (reusing the previous one
 * when the handler kept no reference to it), and the loop runs no bytecode of its own. The
 * Python version in plain.py is the reference: the tests hold both to the same results.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

enum { F_TOPIC, F_PARTITION, F_OFFSET, F_TIMESTAMP, F_KEY, F_VALUE, F_HEADERS, F_DELIVERY,
       FIELDS };
static const char *const field_names[FIELDS] = {
    "topic", "partition", "offset", "timestamp_ms", "key", "value", "headers", "delivery"};

/* Record's type, the byte offset of each of its slots, and NO_HISTORY; read once from
 * redrive.record, whose layout (slots in a plain base class) exists for builders like this. */
static PyTypeObject *record_type;
static Py_ssize_t field_offsets[FIELDS];
static PyObject *no_history;

enum { M_ERROR, M_HEADERS, M_PARTITION, M_TOPIC, M_OFFSET, M_TIMESTAMP, M_KEY, M_VALUE, METHODS };
static const char *const method_names[METHODS] = {
    "error", "headers", "partition", "topic", "offset", "timestamp", "key", "value"};
static PyObject *method_strings[METHODS];
/* confluent-kafka's Message and its methods, called without a lookup per record; other message
 * types (test doubles, subclasses) are called by name. */
static PyTypeObject *message_type;
static PyObject *message_methods[METHODS];
/* inspect.isawaitable, the reference's test of a handler's result. */
static PyObject *isawaitable;

static int load_isawaitable(void) {
    PyObject *module = PyImport_ImportModule("inspect");
    if (module == NULL)
        return -1;
    isawaitable = PyObject_GetAttrString(module, "isawaitable");
    Py_DECREF(module);
    return isawaitable == NULL ? -1 : 0;
}

static int load_message_methods(void) {
    for (int i = 0; i < METHODS; i++) {
        method_strings[i] = PyUnicode_InternFromString(method_names[i]);
        if (method_strings[i] == NULL)
            return -1;
    }
    PyObject *module = PyImport_ImportModule("confluent_kafka");
    if (module == NULL)
        return -1;
    PyObject *type = PyObject_GetAttrString(module, "Message");
    Py_DECREF(module);
    if (type == NULL)
        return -1;
    if (!PyType_Check(type)) {
        Py_DECREF(type);
        PyErr_SetString(PyExc_TypeError, "confluent_kafka.Message is not a class");
        return -1;
    }
    for (int i = 0; i < METHODS; i++) {
        message_methods[i] = PyObject_GetAttr(type, method_strings[i]);
        if (message_methods[i] == NULL) {
            Py_DECREF(type);
            return -1;
        }
    }
    message_type = (PyTypeObject *)type;
    return 0;
}

static int load_record_layout(void) {
    PyObject *module = PyImport_ImportModule("redrive.record");
    if (module == NULL)
        return -1;
    PyObject *type = PyObject_GetAttrString(module, "Record");
    PyObject *slots = PyObject_GetAttrString(module, "_RecordSlots");
    no_history = PyObject_GetAttrString(module, "NO_HISTORY");
    Py_DECREF(module);
    int status = -1;
    if (type == NULL || slots == NULL || no_history == NULL)
        goto done;
    if (!PyType_Check(type) || !PyType_Check(slots)) {
        PyErr_SetString(PyExc_TypeError, "redrive.record.Record is not a class");
        goto done;
    }
    for (int i = 0; i < FIELDS; i++) {
        PyObject *slot = PyDict_GetItemString(((PyTypeObject *)slots)->tp_dict, field_names[i]);
        if (slot == NULL || !Py_IS_TYPE(slot, &PyMemberDescr_Type)) {
            PyErr_Format(PyExc_TypeError, "redrive.record._RecordSlots has no slot %s",
                         field_names[i]);
            goto done;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)slot)->d_member;
        if (member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "redrive.record._RecordSlots.%s is not an object slot",
                         field_names[i]);
            goto done;
        }
        field_offsets[i] = member->offset;
    }
    record_type = (PyTypeObject *)type;
    type = NULL;
    status = 0;
done:
    Py_XDECREF(type);
    Py_XDECREF(slots);
    return status;
}

static PyObject *call_method(PyObject *message, int method) {
    if (Py_IS_TYPE(message, message_type))
        return PyObject_Vectorcall(message_methods[method], &message, 1, NULL);
    /* The slot before self lets the call put the bound method there instead of allocating. */
    PyObject *args[2] = {NULL, message};
    return PyObject_VectorcallMethod(method_strings[method], args + 1,
                                     1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* 1 when the method returns None, 0 when not, -1 on error. */
static int method_is_none(PyObject *message, int method) {
    PyObject *result = call_method(message, method);
    if (result == NULL)
        return -1;
    int none = result == Py_None;
    Py_DECREF(result);
    return none;
}

/* A header name that is not UTF-8 failed headers() with a SystemError and left the message a
 * half-built list that later calls hand back: redrive.kafka.records.mark_unreadable puts a list
 * naming the header in its place, which the runtime dead-letters as malformed. 0 (not a plain
 * record) once marked, -1 on error. */
static int mark_unreadable(PyObject *message) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    PyObject *records = PyImport_ImportModule("redrive.kafka.records");
    PyObject *marked = records == NULL ? NULL
        : PyObject_CallMethod(records, "mark_unreadable", "OO", message, value);
    Py_XDECREF(records);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (marked == NULL)
        return -1;
    Py_DECREF(marked);
    return 0;
}

/* 1 when the method returns a value equal to expected, 0 when not, -1 on error. */
static int method_equals(PyObject *message, int method, PyObject *expected) {
    PyObject *result = call_method(message, method);
    if (result == NULL)
        return -1;
    int equal = PyObject_RichCompareBool(result, expected, Py_EQ);
    Py_DECREF(result);
    return equal;
}

/* A Record of the message, or NULL with an exception set.
 *
 * *spare is the Record of the previous message when the handler kept no reference to it, or
 * NULL. A frozen Record nobody else holds cannot be observed, so refilling its slots is the same
 * as building a new one, without the allocation, the collector's bookkeeping and the generic
 * heap-type dealloc (a tenth of the loop's per-record cost). Its headers list is kept too when
 * it is still empty and only the Record holds it. */
static PyObject *record_of(PyObject *message, PyObject *topic, PyObject *partition,
                           PyObject *offset, PyObject **spare) {
    PyObject *stamp = call_method(message, M_TIMESTAMP);
    if (stamp == NULL)
        return NULL;
    if (!PyTuple_Check(stamp) || PyTuple_GET_SIZE(stamp) != 2) {
        PyErr_Format(PyExc_TypeError, "message.timestamp() returned %R, not (type, ms)", stamp);
        Py_DECREF(stamp);
        return NULL;
    }
    PyObject *timestamp = Py_NewRef(PyTuple_GET_ITEM(stamp, 1));
    Py_DECREF(stamp);
    PyObject *key = call_method(message, M_KEY);
    PyObject *value = key == NULL ? NULL : call_method(message, M_VALUE);
    PyObject *record = *spare, *headers = NULL;
    *spare = NULL;
    if (value != NULL && record != NULL) {
        PyObject *old = *(PyObject **)((char *)record + field_offsets[F_HEADERS]);
        if (Py_REFCNT(old) == 1 && PyList_CheckExact(old) && PyList_GET_SIZE(old) == 0)
            headers = Py_NewRef(old);
    }
    if (value != NULL && headers == NULL)
        headers = PyList_New(0);
    if (headers != NULL && record == NULL)
        record = record_type->tp_alloc(record_type, 0);
    if (headers == NULL || record == NULL) {
        Py_DECREF(timestamp);
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        Py_XDECREF(record);
        return NULL;
    }
    PyObject *values[FIELDS] = {Py_NewRef(topic), Py_NewRef(partition), Py_NewRef(offset),
                                timestamp, key, value, headers, Py_NewRef(no_history)};
    /* The old values go only once the record is whole: their deallocation may run code. */
    PyObject *old[FIELDS];
    for (int i = 0; i < FIELDS; i++) {
        PyObject **slot = (PyObject **)((char *)record + field_offsets[i]);
        old[i] = *slot;
        *slot = values[i];
    }
    for (int i = 0; i < FIELDS; i++)
        Py_XDECREF(old[i]);
    return record;
}

static double monotonic_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* A handler that returned an awaitable called an async function without awaiting it: nothing
 * runs it, so its record fails with the TypeError that plain.not_awaited raises. Returns 1 with
 * an error set (that TypeError, or what the check or close() raised, as in plain.not_awaited),
 * 0 when `result` is not awaitable. */
static int not_awaited(PyObject *result) {
    PyAsyncMethods *async = Py_TYPE(result)->tp_as_async;
    if (async == NULL || async->am_await == NULL) {
        /* Generator-based coroutines and classes registered as collections.abc.Awaitable have
         * no am_await: the reference's inspect.isawaitable decides those. */
        PyObject *verdict = PyObject_CallOneArg(isawaitable, result);
        if (verdict == NULL)
            return 1;
        int awaitable = PyObject_IsTrue(verdict);
        Py_DECREF(verdict);
        if (awaitable <= 0)
            return awaitable < 0;
    }
    if (PyCoro_CheckExact(result)) {
        PyObject *closed = PyObject_CallMethod(result, "close", NULL);
        if (closed == NULL)
            return 1;
        Py_DECREF(closed);
    }
    PyErr_Format(PyExc_TypeError, "the handler returned %s, an awaitable, which redrive does not "
                 "await: its record was not handled", _PyType_Name(Py_TYPE(result)));
    return 1;
}

/* The handler's result for a record: 0 when it returned, 1 when it raised an Exception (kept in
 * *failure with its traceback), -1 when it raised anything else (left set, to propagate). */
static int call_handler(PyObject *handler, PyObject *record, int timed, PyObject *times,
                        PyObject **failure) {
    double started = timed ? monotonic_s() : 0.0;
    PyObject *result = PyObject_CallOneArg(handler, record);
    if (timed) {
        PyObject *took = PyFloat_FromDouble(monotonic_s() - started);
        int appended = took == NULL ? -1 : PyList_Append(times, took);
        Py_XDECREF(took);
        if (appended < 0) {
            Py_XDECREF(result);
            return -1;
        }
    }
    if (result != NULL) {
        int awaitable = result != Py_None && not_awaited(result);
        Py_DECREF(result);
        if (!awaitable)
            return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL)
        PyException_SetTraceback(value, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    *failure = value;
    return 1;
}

PyDoc_STRVAR(handle_plain_doc,
             "handle_plain(messages, start, topic, partition, handler, until_sample, "
             "sample_every, times, stop)\n--\n\n"
             "redrive.consumer.plain.handle_plain_python, in C.");

static PyObject *handle_plain(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "handle_plain() takes 9 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *messages = args[0], *topic = args[2], *partition = args[3], *handler = args[4],
             *times = args[7], *stop = args[8];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    long until_sample = PyLong_AsLong(args[5]);
    long sample_every = PyLong_AsLong(args[6]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_Check(times) || !PyByteArray_Check(stop) || PyByteArray_GET_SIZE(stop) < 1) {
        PyErr_SetString(PyExc_TypeError, "handle_plain() needs times: list, stop: bytearray");
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(messages, "handle_plain() needs a sequence of messages");
    if (sequence == NULL)
        return NULL;
    /* As in the reference: the length is taken once, each message is looked up again. */
    Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence);
    if (start < 0) {
        PyErr_Format(PyExc_ValueError, "handle_plain() start=%zd: must not be negative", start);
        Py_DECREF(sequence);
        return NULL;
    }
    Py_ssize_t index = start, handled = 0;
    PyObject *last = NULL, *failed = NULL, *failure = NULL, *spare = NULL, *message = NULL;
    for (; index < count; index++) {
        /* The runtime stops on SIGTERM through a Python signal handler, which runs only when
         * something checks: a C handler runs no bytecode, so the loop checks, as the reference's
         * own bytecode does. A handler's exception propagates, as from the reference. */
        if (PyErr_CheckSignals() < 0)
            goto error;
        /* A handler may resize the list or the bytearray, moving or freeing their storage: both
         * are read afresh, with the reference's IndexError for one now too short. */
        if (PyByteArray_GET_SIZE(stop) < 1) {
            PyErr_SetString(PyExc_IndexError, "bytearray index out of range");
            goto error;
        }
        if (PyByteArray_AS_STRING(stop)[0])
            break;
        if (index >= PySequence_Fast_GET_SIZE(sequence)) {
            PyErr_SetString(PyExc_IndexError, "list index out of range");
            goto error;
        }
        message = Py_NewRef(PySequence_Fast_GET_ITEM(sequence, index));
        int plain = method_is_none(message, M_ERROR);
        if (plain > 0) {
            plain = method_is_none(message, M_HEADERS);
            if (plain < 0 && PyErr_ExceptionMatches(PyExc_SystemError))
                plain = mark_unreadable(message);
        }
        if (plain > 0)
            plain = method_equals(message, M_PARTITION, partition);
        if (plain > 0)
            plain = method_equals(message, M_TOPIC, topic);
        if (plain < 0)
            goto error;
        if (!plain)
            break;
        PyObject *offset = call_method(message, M_OFFSET);
        if (offset == NULL)
            goto error;
        PyObject *record = record_of(message, topic, partition, offset, &spare);
        Py_CLEAR(message);
        if (record == NULL) {
            Py_DECREF(offset);
            goto error;
        }
        int timed = --until_sample == 0;
        if (timed)
            until_sample = sample_every;
        int outcome = call_handler(handler, record, timed, times, &failure);
        if (outcome != 0) {
            Py_DECREF(offset);
            if (outcome < 0) {
                Py_DECREF(record);
                goto error;
            }
            failed = record;
            index++;
            break;
        }
        if (Py_REFCNT(record) == 1)
            spare = record;
        else
            Py_DECREF(record);
        Py_XSETREF(last, offset);
        handled++;
    }
    Py_XDECREF(message);
    Py_DECREF(sequence);
    Py_XDECREF(spare);
    if (last == NULL && (last = PyLong_FromLong(-1)) == NULL) {
        Py_XDECREF(failed);
        Py_XDECREF(failure);
        return NULL;
    }
    PyObject *result = Py_BuildValue("(nnOlOO)", index, handled, last, until_sample,
                                     failed ? failed : Py_None, failure ? failure : Py_None);
    Py_DECREF(last);
    Py_XDECREF(failed);
    Py_XDECREF(failure);
    return result;
error:
    Py_XDECREF(message);
    Py_DECREF(sequence);
    Py_XDECREF(spare);
    Py_XDECREF(last);
    return NULL;
}

static PyMethodDef methods[] = {
    {"handle_plain", (PyCFunction)(void (*)(void))handle_plain, METH_FASTCALL, handle_plain_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "redrive.consumer._plainrun",
    "The consumer's run of headerless records, in C (see redrive.consumer.plain).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__plainrun(void) {
    if (load_message_methods() < 0 || load_record_layout() < 0 || load_isawaitable() < 0)
        return NULL;
    return PyModule_Create(&module_def);
}
