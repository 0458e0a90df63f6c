"""UserError: the one exception type for a mistake in what the user gave, which main.py prints as one line.

A user error is a value on the command line or in the config, or a file or folder it names, that
cannot work: an unknown stage, a `model.init` of no known form, a checkpoint or store that is not
there. Its message names the value and what would work. `python -m rmsweb_jax.main` prints it as
one line and exits with status 2; the traceback is shown with --verbosity=1 or RMSWEB_TRACEBACK=1.
A ValueError, so that code checking values keeps catching it. Anything else is a bug and keeps its
traceback. The small commands (the viewer, the planner) end the same way through run_absl_command, which
also makes --help exit 0 (absl's own exits 1).
"""
import errno
import os
import sys

from absl import app, flags


class UserError(ValueError):
    """A command-line value, config value or input path that cannot work; the message says what would."""


HELP_FLAGS = ("--help", "-help", "-h", "--helpshort", "--helpfull", "--helpxml", "-?")
USAGE_ERROR = 2  # exit status of a user error, as argparse and absl's usage errors use


def run_absl_command(main, prog: str) -> None:
    """Runs `main` under absl.app as the command `prog`: --help prints the usage and exits 0 (absl's exits 1),
    a flag mistake or a UserError prints one line "<prog>: error: ..." and exits 2 (RMSWEB_TRACEBACK=1 keeps the
    traceback). For the small commands (viewer, plan); rmsweb_jax/main.py does the same with its config hints."""
    def parse(argv):
        try:
            return flags.FLAGS(argv)
        except SystemExit as done:
            if done.code == 1 and wants_help(argv):
                sys.exit(0)
            raise
        except flags.Error as err:
            if os.environ.get("RMSWEB_TRACEBACK") == "1":
                raise
            exit_with_one_line(prog, err)

    def guarded(argv):
        try:
            return main(argv)
        except UserError as err:
            if os.environ.get("RMSWEB_TRACEBACK") == "1":
                raise
            exit_with_one_line(prog, err)

    app.run(guarded, flags_parser=parse)


def wants_help(argv) -> bool:
    """Returns whether the command line asks for help (absl then prints the usage and exits)."""
    return any(str(arg).split("=")[0] in HELP_FLAGS for arg in list(argv)[1:])


def one_line(err: BaseException) -> str:
    """Returns `err`'s message on one line (ml_collections adds "\nDid you mean ..."; a KeyError's str() is a
    repr of its key, so its argument is taken instead)."""
    message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
    return " ".join(str(message).split())


def exit_with_one_line(prog: str, err: BaseException, hint: str = "") -> None:
    """Prints `err` as one line "<prog>: error: ..." on stderr and exits 2."""
    message = one_line(err)
    print(f"{prog}: error: {message}{' ' + hint if hint else ''}", file=sys.stderr, flush=True)
    sys.exit(USAGE_ERROR)


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXTS = ("no space left on device", "disk quota exceeded")  # as tensorstore and Orbax's wrappers word them
# A bucket's project past a quota (HTTP 403, reason quotaExceeded), as gcsfs's OSError and tensorstore's
# PERMISSION_DENIED quote it; only from a write to GCS, not another service's quota (a judge's API)
_QUOTA_TEXTS, _GCS_TEXTS = ("quota exceeded", "quotaexceeded"), ("gs://", "/storage/v1/b/")


def disk_full(err: BaseException) -> OSError | str | None:
    """Returns the OSError (or the message) of a full disk, a disk quota or a bucket's quota anywhere in `err`'s chain
    of causes, else None: Orbax, tensorstore and gcsfs wrap the writer's error in errors of their own."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL_ERRNOS:
            return err
        text = str(err)
        lower = text.lower()
        if any(t in lower for t in _FULL_TEXTS) or (any(t in lower for t in _QUOTA_TEXTS)
                                                     and any(t in text for t in _GCS_TEXTS)):
            return " ".join(text.split())[:300]
        err = err.__cause__ or err.__context__
    return None
