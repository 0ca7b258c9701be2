"""Where ``fn``'s code came from, so that a rank's traceback names the reader's cell and line.

Why a module of its own: ``fn`` travels to the ranks by value (cloudpickle), and cloudpickle
renames the file of every code object it ships ``<dynamic-code>`` (so that a payload does not
depend on where it was made). A rank's traceback then says ``File "<dynamic-code>", line 4,
in fn`` with no source. So the caller ships, beside the payload, the real file name of each of
those code objects and the source lines of files that exist only in memory (a notebook cell:
IPython keeps its source in ``linecache``); the rank puts both back before calling ``fn``.
The caller then writes a cell's file name as IPython does (``Cell In[3], line 4``).
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import types

__all__ = ["code_origins", "restore_origins", "for_the_reader"]

_DYNAMIC = "<dynamic-code>"


def _reachable(fn):
    """The functions that travel with ``fn``: itself, those it names, its closure's, its classes'."""
    seen, todo, found = set(), [fn], []
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, types.MethodType):
            todo.append(obj.__func__)
        elif isinstance(obj, type) and obj.__module__ == "__main__":
            todo.extend(vars(obj).values())
        elif isinstance(obj, (staticmethod, classmethod)):
            todo.append(obj.__func__)
        elif isinstance(obj, types.FunctionType) and _by_value(obj):
            found.append(obj)
            names = set()
            for code in _codes(obj.__code__):
                names.update(code.co_names)
            todo.extend(obj.__globals__[n] for n in names if n in obj.__globals__)
            todo.extend(cell.cell_contents for cell in obj.__closure__ or ()
                        if _has_contents(cell))
            todo.extend((obj.__defaults__ or ()))
    return found


def _by_value(fn) -> bool:
    """Whether cloudpickle ships ``fn`` by value (a module's function travels by name)."""
    module = getattr(fn, "__module__", None)
    return module == "__main__" or module not in sys.modules


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def _codes(code):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _key(code) -> tuple:
    return getattr(code, "co_qualname", code.co_name), code.co_firstlineno


def code_origins(*objects) -> dict:
    """In the caller: each reachable code object's file, and the lines of in-memory files."""
    files, lines = {}, {}
    for obj in objects:
        for fn in _reachable(obj):
            for code in _codes(fn.__code__):
                name = code.co_filename
                files.setdefault(_key(code), name)
                if name not in lines and not os.path.exists(name):
                    source = linecache.getlines(name)
                    if source:
                        lines[name] = source
    return {"files": files, "lines": lines}


def restore_origins(origins: dict, *objects) -> None:
    """In a rank: give ``<dynamic-code>`` back its file names and the lines of those files."""
    files = origins.get("files", {})
    for name, source in origins.get("lines", {}).items():
        linecache.cache[name] = (sum(map(len, source)), None, list(source), name)
    for obj in objects:
        for fn in _reachable(obj):
            if fn.__code__.co_filename == _DYNAMIC:
                fn.__code__ = _renamed(fn.__code__, files)


def _renamed(code, files):
    consts = tuple(_renamed(c, files) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    name = files.get(_key(code), code.co_filename) if code.co_filename == _DYNAMIC else code.co_filename
    return code.replace(co_filename=name, co_consts=consts)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def for_the_reader(traceback_text: str) -> str:
    """In the caller: a notebook cell's file written as IPython writes it (``Cell In[3], line 4``)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    cells = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if not cells:
        return traceback_text

    def cell(match):
        number = cells.get(match.group(1))
        return match.group(0) if number is None else f"Cell In[{number}], line {match.group(2)}"
    return _FRAME.sub(cell, traceback_text)
