"""What of a submitter's environment `corral submit` sends for `env_from: submitter`."""

from __future__ import annotations

import pytest

from corral.submitenv import MAX_BYTES, refusal, submitter_environment


def test_corrals_credentials_secrets_the_session_and_bad_names_stay_behind() -> None:
    shell = {
        "PATH": "/home/bob/venv/bin:/usr/bin",
        "VIRTUAL_ENV": "/home/bob/venv",
        "LANG": "C.UTF-8",
        "CORRAL_TOKEN": "t0ken",
        "CORRAL_URL": "http://manager:8470",
        "CORRAL_CHECKPOINT_DIR": "/mine",
        "GITHUB_TOKEN": "ghp_x",
        "AWS_SECRET_ACCESS_KEY": "k",
        "OPENAI_API_KEY": "k",
        "DB_PASSWORD": "p",
        "SSH_AUTH_SOCK": "/tmp/ssh-agent",
        "HOME": "/home/bob",
        "PWD": "/home/bob/project",
        "BASH_FUNC_module%%": "() { eval $(modulecmd bash $*); }",
        "my-var": "x",
        "UNDECODABLE": "caf\udce9",  # bytes that were not UTF-8, as Python keeps them
        "NUL": "a\0b",
    }
    assert submitter_environment(shell) == {
        "LANG": "C.UTF-8",
        "PATH": "/home/bob/venv/bin:/usr/bin",
        "VIRTUAL_ENV": "/home/bob/venv",
    }


def test_the_largest_variables_are_left_out_until_the_rest_fits() -> None:
    shell = {"BIG": "x" * MAX_BYTES, "MIDDLE": "y" * 1000, "SMALL": "z"}
    assert submitter_environment(shell) == {"MIDDLE": "y" * 1000, "SMALL": "z"}
    at_cap = {"A": "x" * (MAX_BYTES - 2)}  # "A=" + value: exactly MAX_BYTES
    assert submitter_environment(at_cap) == at_cap
    assert submitter_environment({"A": "x" * (MAX_BYTES - 1)}) == {}


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("PATH", True),
        ("_ModuleTable001_", True),
        ("LD_LIBRARY_PATH", True),
        ("CUDA_HOME", True),
        ("KEYBOARD", True),  # "KEY" alone is no secret
        ("9LIVES", False),
        ("A-B", False),
        ("", False),
        ("Corral_Token", False),
        ("MAIL", False),
        ("HF_TOKEN", False),
        ("private_key_file", False),
    ],
)
def test_which_names_may_pass(name: str, allowed: bool) -> None:
    assert (refusal(name) is None) is allowed
