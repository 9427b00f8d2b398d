"""Collect the text of `builtin:python-docs`: the `pydoc` topics and the standard library's docstrings.

A program, not a library module: `python -I -S _stdlib_docs.py OUT MIN_CHARS` writes the documents, a JSON list of
strings, to the file OUT. [`adloco_hf.data.sources.load_builtin_corpus`] runs it in a fresh interpreter started with
`-I -S`: only the standard library is on sys.path (and this file imports nothing else), so the text depends on the
Python version alone (not on installed packages, nor on what the caller imported or monkeypatched), and import side
effects (atexit hooks, threads, signal handlers, output) die with the child. Modules that print are dropped.

Skipped on purpose: modules that act when imported (`antigravity` opens a browser, `this` prints, `readline` writes
terminal codes, `rlcompleter` imports it), GUI and IDE packages, test packages and C test modules, and
`distutils`/`lib2to3` (deprecated, gone in 3.12/3.13). Everything is sorted and each docstring is kept once.
Documents shorter than MIN_CHARS characters are dropped.
"""

import contextlib
import importlib
import inspect
import io
import json
import pkgutil
import pydoc_data.topics
import sys
import warnings


SKIP = {
    "__main__",
    "antigravity",
    "this",
    "readline",
    "rlcompleter",
    "idlelib",
    "tkinter",
    "turtle",
    "turtledemo",
    "test",
    "xxlimited",
    "xxlimited_35",
    "xxsubtype",
    "distutils",
    "lib2to3",
    "pydoc_data",
}
SKIP_PARTS = {"test", "tests", "idle_test"}


def public(name):
    return not any(part.startswith("_") for part in name.split("."))


def quiet_import(name):
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            module = importlib.import_module(name)
    except BaseException:
        return None
    return None if sink.getvalue() else module


def clean(doc):
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None


def docstrings(module):
    yield clean(module.__doc__)
    exported = getattr(module, "__all__", None)
    if not (isinstance(exported, (list, tuple)) and all(isinstance(n, str) for n in exported)):
        exported = None
    for name in sorted(set(exported or (n for n in dir(module) if not n.startswith("_")))):
        obj = getattr(module, name, None)
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        # Without __all__, only what the module defines: imported names are documented where they live.
        if exported is None and getattr(obj, "__module__", None) != module.__name__:
            continue
        yield clean(obj.__doc__)
        if inspect.isclass(obj):
            for attr, member in sorted(vars(obj).items()):
                if not attr.startswith("_") and (inspect.isroutine(member) or isinstance(member, property)):
                    yield clean(getattr(member, "__doc__", None))


def main(out_path, min_chars):
    documents, seen = [], set()
    for key in sorted(pydoc_data.topics.topics):
        text = pydoc_data.topics.topics[key].strip()
        if len(text) >= min_chars and text not in seen:
            seen.add(text)
            documents.append(text)

    top_level = {m.name for m in pkgutil.iter_modules()} | set(sys.builtin_module_names)
    for top in sorted(n for n in top_level if public(n) and n not in SKIP):
        module = quiet_import(top)
        if module is None:
            continue
        names = [top]
        if hasattr(module, "__path__"):
            subs = pkgutil.walk_packages(module.__path__, top + ".", onerror=lambda name: None)
            names += sorted(m.name for m in subs if public(m.name) and not SKIP_PARTS & set(m.name.split(".")))
        for name in names:
            module = quiet_import(name)
            if module is None:
                continue
            parts = []
            for doc in docstrings(module):
                if doc and doc not in seen:
                    seen.add(doc)
                    parts.append(doc)
            text = "\n\n".join(parts)
            if len(text) >= min_chars:
                documents.append(text)

    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(documents, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
