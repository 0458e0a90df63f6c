"""UserError: the one exception type for a mistake in what the user gave, which main.py prints as one line.

A user error is a value on the command line or in the config, or a file or folder it names, that
cannot work: an unknown stage, a `model.init` of no known form, a checkpoint or store that is not
there. Its message names the value and what would work. `python -m rmsweb_jax.main` prints it as
one line and exits with status 2; the traceback is shown with --verbosity=1 or RMSWEB_TRACEBACK=1.
A ValueError, so that code checking values keeps catching it. Anything else is a bug and keeps its
traceback.
"""


class UserError(ValueError):
    """A command-line value, config value or input path that cannot work; the message says what would."""
