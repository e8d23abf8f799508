"""ringtrain: trains image classifiers with libtorch, from one command.

The package holds the release binary (bin/ringtrain), its recipes and bench scripts; the
`ringtrain` command (and `python -m ringtrain`) runs it against the libtorch of the installed
torch package. See __main__.py.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
BINARY = os.path.join(HERE, "bin", "ringtrain")
