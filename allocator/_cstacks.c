/* The memory history's stack capture in C: allocator._stacks.capture without the interpreter.
 *
 * capture(skip) returns the calling thread's Python stack as one flat tuple
 * (code, lasti, code, lasti, ...), innermost first: exactly what the pure-Python
 * allocator._stacks.capture_python returns for the same frames (PyFrame_GetLasti is
 * frame.f_lasti, PyFrame_GetBack is frame.f_back). It only reads frames and takes new
 * references to their code objects; it keeps no frame, so no caller's locals outlive it.
 *
 * Written against the limited, documented frame API of CPython 3.11 (PyFrame_GetLasti is new
 * there); on older versions the build fails and allocator._stacks falls back to Python. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000
#error "allocator._cstacks needs CPython 3.11 or newer (PyFrame_GetLasti)"
#endif

static PyObject *
capture(PyObject *module, PyObject *arg)
{
    long skip = PyLong_AsLong(arg);
    if (skip == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (skip < 1) {
        PyErr_Format(PyExc_ValueError, "skip must be at least 1, got %ld", skip);
        return NULL;
    }
    /* a C function has no frame: the current frame is its caller's, sys._getframe(1) */
    PyFrameObject *frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    for (long i = 1; i < skip && frame != NULL; i++) {
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    if (frame == NULL) {
        PyErr_SetString(PyExc_ValueError, "call stack is not deep enough");
        return NULL;
    }
    /* new references, collected on the C stack (a heap buffer past SMALL of them), then
     * handed to a tuple of the exact size */
    enum { SMALL = 256 };
    PyObject *small[SMALL];
    PyObject **items = small;
    Py_ssize_t n = 0, capacity = SMALL;
    while (frame != NULL) {
        if (n + 2 > capacity) {
            PyObject **grown = PyMem_Malloc(2 * capacity * sizeof(PyObject *));
            if (grown == NULL) {
                PyErr_NoMemory();
                goto error;
            }
            memcpy(grown, items, n * sizeof(PyObject *));
            if (items != small) {
                PyMem_Free(items);
            }
            items = grown;
            capacity *= 2;
        }
        PyObject *lasti = PyLong_FromLong(PyFrame_GetLasti(frame));
        if (lasti == NULL) {
            goto error;
        }
        items[n++] = (PyObject *)PyFrame_GetCode(frame);
        items[n++] = lasti;
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    PyObject *stack = PyTuple_New(n);
    if (stack == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTuple_SET_ITEM(stack, i, items[i]); /* steals the reference */
    }
    if (items != small) {
        PyMem_Free(items);
    }
    return stack;

error:
    Py_XDECREF(frame);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(items[i]);
    }
    if (items != small) {
        PyMem_Free(items);
    }
    return NULL;
}

static PyMethodDef methods[] = {
    {"capture", capture, METH_O,
     "capture(skip) -> (code, lasti, ...): the stack from sys._getframe(skip), innermost "
     "first (see allocator._stacks.capture)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "allocator._cstacks",
    "The memory history's stack capture in C (allocator._stacks).", -1, methods,
};

PyMODINIT_FUNC
PyInit__cstacks(void)
{
    return PyModule_Create(&module);
}
