"""Process-wide jaxaot settings: ``jaxaot.config``.

Every setting is a typed attribute of :data:`config`, checked when it is set: a
wrong value raises :class:`~jaxaot.errors.InvalidValueError` at once and leaves
the old value in place. Each has an environment variable (``JAXAOT_`` and the
name in capitals), read once, when a :class:`Config` is made (for
:data:`config`, when the settings are first used), and checked the same way. The modules
that use a setting read it from :data:`config` at the moment they need it, so a
change takes effect at the next trace or compile; the settings that shape
programs (:attr:`Setting.traced`) are part of JAX's cache keys, so a function
``jax.jit`` compiled under other values is traced again. ``docs/config.md``
tables them all.

Example:
    >>> import jaxaot
    >>> with jaxaot.config.override(cache_dir=None, quiet=True):
    ...     jaxaot.config.cache_dir, jaxaot.config.quiet
    (None, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from jaxaot.errors import InvalidInputError, InvalidValueError

#: The schedules a bounded ``checkpoints=k`` loop can run (:mod:`jaxaot._src.loops.offline`).
OFFLINE_SCHEDULES = ("nested", "binomial")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class _Refused(Exception):
    """Why a value is refused (the caller names the setting or the variable)."""


# --------------------------------------------------------------------------- checks: value -> value stored
def _path(what_none: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, (str, os.PathLike)):
            raise _Refused(f"expected a path (str or os.PathLike) or None ({what_none}), got {type(value).__name__}")
        text = os.fspath(value)
        if not isinstance(text, str):
            raise _Refused(f"expected a text path, got a {type(text).__name__} path; decode it first")
        if not text:
            raise _Refused(f"an empty path; give None for {what_none}")
        if "\0" in text:
            raise _Refused("a path with a NUL character, which no file system accepts")
        if text.startswith("~"):  # as a shell would: never a folder named "~" in the working directory
            return os.path.expanduser(text) if isinstance(value, str) else type(value)(os.path.expanduser(text))
        return value
    return check


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        t = type(value)
        name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"  # numpy.bool, not bool
        raise _Refused(f"expected True or False, got {name} {value!r}")
    return value


def _bool_or_none(value: Any) -> bool | None:
    return None if value is None else _bool(value)


#: The most steps ``online_block`` takes per predicate check.
MAX_ONLINE_BLOCK = 1 << 16


def _positive_int_or_none(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _Refused(f"expected a positive int or None, got {type(value).__name__}")
    if value < 1:
        raise _Refused("expected a positive number of steps; None lets the platform decide")
    if value > MAX_ONLINE_BLOCK:
        raise _Refused(f"expected at most {MAX_ONLINE_BLOCK} steps per predicate check (a block's steps are a loop "
                       f"trip count, and with unroll_blocks each is a copy of the body)")
    return int(value)


#: The most executables the compiled-autograd cache may be set to keep.
MAX_CACHE_SIZE = 1 << 20


def _cache_size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _Refused(f"expected a positive int, got {type(value).__name__}")
    if not 1 <= value <= MAX_CACHE_SIZE:
        raise _Refused(f"expected from 1 to {MAX_CACHE_SIZE} executables")
    return int(value)


def _schedule_or_none(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in OFFLINE_SCHEDULES:  # an array would compare equal
        t = type(value)
        name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"
        got = "" if isinstance(value, str) else f", got {name}"
        raise _Refused(f"expected one of {OFFLINE_SCHEDULES} or None (the platform decides){got}")
    return str(value)  # np.str_ stored as the str it is


# --------------------------------------------------------------------------- parsers: environment text -> value
def _text(text: str) -> str:
    return text


def _word(text: str) -> str:
    """A choice's name, read as the flags are: surrounding blanks dropped."""
    return text.strip()


def _flag(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise _Refused(f"expected one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}")


def _integer(text: str) -> int:
    word = text.strip()
    if not (word.lstrip("+-").isascii() and word.lstrip("+-").isdigit()) or word.count("-") + word.count("+") > 1:
        raise _Refused("expected an integer in decimal digits")  # not int()'s '1_000' or other scripts' digits
    return int(word)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its name, type (as docs/config.md shows it), default, check, and how its variable reads.

    ``traced``: the programs jaxaot traces or lowers depend on it, so JAX's caches are keyed by it
    (:mod:`jaxaot._src.compat.loop_support` watches these).
    """

    name: str
    type: str
    default: Any
    check: Callable[[Any], Any]
    parse: Callable[[str], Any]
    doc: str
    traced: bool = False

    @property
    def env(self) -> str:
        """The environment variable that sets it when a :class:`Config` is made."""
        return "JAXAOT_" + self.name.upper()

    def checked(self, value: Any) -> Any:
        """``value`` as stored, or :class:`~jaxaot.errors.InvalidValueError` saying what is wrong."""
        try:
            return self.check(value)
        except _Refused as why:
            raise InvalidValueError(f"jaxaot.config.{self.name} = {value!r}: {why}. {self.doc}") from None

    def from_env(self, environ: Mapping[str, str]) -> Any:
        """The value ``environ`` gives (the default when the variable is unset or empty)."""
        text = environ.get(self.env, "")
        if not text.strip():
            return self.default
        try:
            return self.check(self.parse(text))
        except _Refused as why:
            raise InvalidValueError(f"environment variable {self.env}={text!r}: {why}. {self.doc} "
                                    f"Fix or unset {self.env}.") from None


#: Every setting, by name.
SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting("cache_dir", "path or `None`", None, _path("no cache"), _text,
            "The folder of the persistent compile cache; None turns the cache off."),
    Setting("cache_key_file", "path or `None`", None, _path("$XDG_CONFIG_HOME/jaxaot/cache-key"), _text,
            "The file holding the key that signs cache entries; None: $XDG_CONFIG_HOME/jaxaot/cache-key."),
    Setting("quiet", "bool", False, _bool, _flag,
            "Whether progress output is silenced."),
    Setting("online_block", "int from 1 to 65536, or `None`", None, _positive_int_or_none, _integer,
            "Steps per predicate check of a checkpoints=k loop's schedule; None: 4 on GPUs, 1 elsewhere.", True),
    Setting("offline_schedule", '`"nested"`, `"binomial"` or `None`', None, _schedule_or_none, _word,
            "The schedule of a bounded checkpoints=k loop, 'nested' or 'binomial'; None: nested on GPUs, "
            "binomial elsewhere.", True),
    Setting("blocked_loops", "bool", False, _bool, _flag,
            "Whether loops lower in blocks of a constant trip count on every platform (GPUs always do).", True),
    Setting("unroll_blocks", "bool", True, _bool, _flag,
            "Whether a blocked loop's steps are unrolled within each block: fewer kernels per step, longer "
            "compiles.", True),
    Setting("stack_segments", "bool or `None`", None, _bool_or_none, _flag,
            "Whether a max_steps loop's large stack runs in segments; None: on CPUs only.", True),
    Setting("start_steps_ahead", "bool", True, _bool, _flag,
            "Whether compiled_value_and_grad starts a step's executable before its forward is recorded, once two "
            "calls in a row ran it."),
    Setting("provisional_steps", "bool", False, _bool, _flag,
            "Whether a byte budget's first steps on a CPU run the search's cheaper executable of the plan while the "
            "runtime's own compile finishes; their results may differ in the last bits, from a step that timing "
            "decides."),
    Setting("tune_in_background", "bool", True, _bool, _flag,
            "Whether value_and_grad's first call on an accelerator runs the fused step once it compiles and weighs "
            "its variants and the split programs over the calls that follow; False: the first call weighs them."),
    Setting("compiled_autograd_cache_size", "int from 1 to 1048576", 4096, _cache_size, _integer,
            "The most compiled steps and backwards compiled_value_and_grad keeps, process-wide; past it the least "
            "recently used is dropped, and compiles again when its structure comes back."),
)}


def _setting(name: str) -> Setting:
    try:
        return SETTINGS[name]
    except KeyError:
        raise AttributeError(f"jaxaot.config has no setting {name!r}; the settings are {', '.join(SETTINGS)}.") \
            from None


class Config:
    """Mutable settings, read at the moment they are needed (not captured).

    ``Config(**values)`` takes the settings given, the rest from the environment.

    Attributes:
      cache_dir: the folder of the persistent compile cache (partitions, compiled
        executables, measured op costs); ``None`` turns the cache off. ``JAXAOT_CACHE_DIR``.
      cache_key_file: the file of the per-user key that signs cache entries (made,
        mode 0600, on first use); ``None``: ``$XDG_CONFIG_HOME/jaxaot/cache-key``.
        ``JAXAOT_CACHE_KEY_FILE``.
      quiet: silences all progress output. ``JAXAOT_QUIET``.
      online_block: steps per predicate check of an unbounded ``checkpoints=k``
        loop's schedule (read when the loop is traced); ``None``: 4 on GPUs, 1
        elsewhere. ``JAXAOT_ONLINE_BLOCK``.
      offline_schedule: ``"nested"`` or ``"binomial"``, the schedule of a
        ``max_steps`` with ``checkpoints`` loop (read when it is traced); ``None``:
        nested on GPUs, binomial elsewhere. ``JAXAOT_OFFLINE_SCHEDULE``.
      blocked_loops: lower loops in blocks of a constant trip count on every
        platform, as on GPUs (read when a loop is lowered). ``JAXAOT_BLOCKED_LOOPS``.
      unroll_blocks: unroll the steps of each block of a blocked ``checkpoints=k``
        loop (read when the loop is traced): fewer kernels per step, a program that
        holds each blocked body ``online_block`` times. ``JAXAOT_UNROLL_BLOCKS``.
      stack_segments: run a ``max_steps`` loop's large stack in segments (read
        when the loop is differentiated); ``None``: on CPUs only. ``JAXAOT_STACK_SEGMENTS``.
      start_steps_ahead: a ``compiled_value_and_grad`` call starts its step's
        executable before its forward is recorded, once two calls in a row ran it
        (read at each call). ``JAXAOT_START_STEPS_AHEAD``.
      provisional_steps: on a CPU, a byte budget's first calls run the executable
        the search measured the chosen plan with (cheaper compile options) while
        the runtime's own compile of the program finishes on a worker, which then
        takes over. Off by default: the two executables' results may differ in the
        last bits, and which call the runtime's takes over at depends on timing, so
        runs would not repeat bit for bit; and the plan is chosen by the cheaper
        compile's peak, which may differ from the runtime's (read when a signature's
        step compiles). ``JAXAOT_PROVISIONAL_STEPS``.
      tune_in_background: ``jaxaot.value_and_grad``'s first call of a signature on
        an accelerator returns as soon as the fused step compiles; its variants and
        the split programs compile on worker threads, and the calls that follow
        make the choices with them (read at the first call; without a byte
        budget). False: the first call makes every choice before it returns.
        ``JAXAOT_TUNE_IN_BACKGROUND``.
      compiled_autograd_cache_size: the most compiled steps and backwards
        ``compiled_value_and_grad`` keeps, shared by all functions (read when one
        compiles); past it the least recently used is dropped, and the compile
        that brings it back says so. ``JAXAOT_COMPILED_AUTOGRAD_CACHE_SIZE``.
    """

    cache_dir: str | os.PathLike | None
    cache_key_file: str | os.PathLike | None
    quiet: bool
    online_block: int | None
    offline_schedule: str | None
    blocked_loops: bool
    unroll_blocks: bool
    stack_segments: bool | None
    start_steps_ahead: bool
    provisional_steps: bool
    tune_in_background: bool
    compiled_autograd_cache_size: int

    def __init__(self, **values: Any) -> None:
        for name in values:
            _setting(name)
        base = {s.name: s.checked(values[s.name]) if s.name in values else s.from_env(os.environ)
                for s in SETTINGS.values()}
        # _base: the values set outside any override; _layers: the overrides in force, oldest first.
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_layers", [])
        object.__setattr__(self, "_lock", threading.RLock())
        object.__setattr__(self, "_watchers", [])
        self.__dict__.update(base)

    if not TYPE_CHECKING:  # type checkers see the settings above alone, and flag a misspelt name

        def __getattr__(self, name: str) -> Any:  # only for names that are not settings
            if name.startswith("__"):
                raise AttributeError(name)
            _setting(name)
            raise AttributeError(name)

        def __setattr__(self, name: str, value: Any) -> None:
            value = _setting(name).checked(value)
            with self._lock:
                owner = next((layer for _, layer in reversed(self._layers) if name in layer), self._base)
                owner[name] = value
                self._refresh(name)
                self._changed()

    def __delattr__(self, name: str) -> None:
        _setting(name)
        raise AttributeError(f"jaxaot.config.{name} cannot be deleted; set it (None where that means the default).")

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *SETTINGS} - {"_base", "_layers", "_lock", "_watchers"})

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in SETTINGS) + ")"

    def watch(self, fn: Callable[["Config"], None]) -> None:
        """Call ``fn(self)`` at once and after every change of a setting (under the settings' lock, so the calls
        see the changes in the order they happen). A ``fn`` that is not callable is refused, and
        one whose first call raises is not kept."""
        if not callable(fn):
            raise InvalidInputError(f"jaxaot.config.watch takes a function of the config, got {type(fn).__name__}.")
        with self._lock:
            fn(self)
            self._watchers.append(fn)

    def _changed(self) -> None:
        for fn in self._watchers:
            fn(self)

    def _refresh(self, name: str) -> None:
        """The value of ``name`` in force: the newest override's that sets it, else the base one."""
        self.__dict__[name] = next((layer[name] for _, layer in reversed(self._layers) if name in layer),
                                   self._base[name])

    @contextlib.contextmanager
    def override(self, **changes: Any) -> Iterator["Config"]:
        """Set some settings for the duration of a ``with`` block, then restore them (also on an exception).

        Every change is checked before any applies. Overrides nest, and overrides
        entered and left by several threads in any order restore what was set
        outside them; a setting the override holds, assigned inside it, lasts until it ends (any other stays set).

        Example:
            >>> import jaxaot
            >>> with jaxaot.config.override(cache_dir="/tmp/jaxaot-cache"):
            ...     str(jaxaot.config.cache_dir)
            '/tmp/jaxaot-cache'
        """
        layer = {name: _setting(name).checked(value) for name, value in changes.items()}
        token = object()
        try:
            with self._lock:
                self._layers.append((token, layer))
                for name in layer:
                    self._refresh(name)
                self._changed()  # a watcher that raises here leaves nothing of the override behind
            yield self
        finally:
            with self._lock:
                self._layers[:] = [(t, d) for t, d in self._layers if t is not token]
                for name in layer:
                    self._refresh(name)
                self._changed()


config = Config()
