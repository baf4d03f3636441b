"""What of a submitter's environment a job may take (`env_from: submitter`, docs/job-spec.md).

Shared by the client, which leaves out what must never travel (`submitter_environment`), and the
server, which refuses it when a client sends it anyway (`refusal`). Pure and light: the CLI
imports it on every `corral submit`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

#: A name the shells agree on: letters, digits and `_`, not starting with a digit. Others (bash's
#: exported functions `BASH_FUNC_f%%`, names with `-` or `.`) are left out by the client and
#: refused by the server.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: corral's own variables: the submitter's credentials (CORRAL_TOKEN, CORRAL_URL) and the ones
#: corral sets per worker (CORRAL_CHECKPOINT_DIR, ...). None of them is the submitter's to pass.
OWN_PREFIX = "CORRAL_"
#: The account the job runs as sets these (multi-user mode: its HOME, not the submitter's).
ACCOUNT = frozenset({"HOME", "USER", "LOGNAME", "SHELL", "MAIL"})
#: The submitter's login session: meaningless, or a way into it, on the job's machine (an ssh
#: agent's socket above all).
SESSION = frozenset(
    {
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "SSH_TTY",
        "DISPLAY",
        "XAUTHORITY",
        "DBUS_SESSION_BUS_ADDRESS",
        "XDG_RUNTIME_DIR",
        "XDG_SESSION_ID",
        "GPG_AGENT_INFO",
        "KRB5CCNAME",
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    }
)
#: Names that look like secrets: the job's spec (with what the submitter sent) is stored and shown
#: to whoever may read the job. A job that needs one names it in `env` on purpose.
SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE|API_?KEY|ACCESS_?KEY")
#: The most bytes (`NAME=value`, summed) a submitter's environment may have: a login shell's is
#: a few KiB; this leaves room, well under the store's cap on a whole spec (256 KiB).
MAX_BYTES = 64 * 1024


def refusal(name: str) -> str | None:
    """Why `name` may not come from the submitter's environment; None when it may."""
    if not NAME.match(name):
        return "a variable name must be letters, digits and '_', not starting with a digit"
    if name.upper().startswith(OWN_PREFIX):
        return "corral's own variables (its credentials, what it sets per worker) are never passed"
    if name in ACCOUNT:
        return "the account the job runs as sets it"
    if name in SESSION:
        return "it belongs to the submitter's login session"
    if SECRET.search(name.upper()):
        return "it looks like a secret (put it in env on purpose if the job needs it)"
    return None


def submitter_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (default: this process's) a job may take, in name order;
    the largest are left out until the rest fits in MAX_BYTES."""
    source = os.environ if environ is None else environ
    kept = {
        name: value
        for name, value in sorted(source.items())
        if refusal(name) is None and _utf8(value) and "\0" not in value
    }
    size = sum(len(f"{name}={value}".encode()) for name, value in kept.items())
    for name in sorted(kept, key=lambda n: -len(kept[n].encode())):
        if size <= MAX_BYTES:
            break
        size -= len(f"{name}={kept.pop(name)}".encode())
    return kept


def _utf8(text: str) -> bool:
    """Whether `text` is UTF-8 text (not bytes the OS could not decode, kept as surrogates)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
