"""The ``slurm.rest:`` section: how ``transport: rest`` reaches slurmrestd
(:func:`dagster_gpu.slurm.rest.client_from_settings` builds the client from it)."""

from __future__ import annotations

from dataclasses import dataclass

from dagster_gpu.settings.schema import setting


@dataclass(frozen=True)
class SlurmRestSettings:
    """The ``rest:`` section of the ``slurm:`` section, typed (its defaults are written here only)."""

    url: str | None = setting(None, "slurmrestd's base URL, e.g. http://127.0.0.1:6820 or https://slurm.example.org.",
                              was="rest_url")
    user: str | None = setting(None, "The Slurm user the token is for (X-SLURM-USER-NAME); unset for a token that "
                                     "names its user.", was="rest_user")
    token_env: str = setting("SLURM_JWT", "Environment variable holding the JWT (scontrol token).", was="rest_token_env")
    token_file: str | None = setting(None, "File holding the JWT (mode 0600, re-read when it changes; Slurm's default "
                                           "token lifespan is 1800 s); wins over token_env.", was="rest_token_file")
    auth_header: str = setting("x-slurm", "'x-slurm' (X-SLURM-USER-TOKEN) or 'bearer' (Authorization: Bearer).",
                               was="rest_auth_header")
    data_parser: str | None = setting(None, "data_parser version, e.g. v0.0.42; default: the newest of v0.0.40-v0.0.44 "
                                            "the server serves (/openapi/v3).", was="rest_data_parser")
    max_array_size: int = setting(1001, "The cluster's MaxArraySize (slurmrestd does not serve slurm.conf; Slurm's "
                                        "default 1001).", was="rest_max_array_size")
    forward_env: tuple[str, ...] = setting(("DAGSTER_*", "PATH"), "This process's variables (fnmatch patterns) put in "
                                                                  "each job's environment; names with PASSWORD, SECRET, "
                                                                  "TOKEN or JWT never (use slurm.env_files).",
                                           was="rest_forward_env")
    working_dir: str = setting("/tmp", "The jobs' working directory on the cluster.", was="rest_working_dir")
    ca_file: str | None = setting(None, "CA bundle for an https url (default: the system's).", was="rest_ca_file")
    token_wait_seconds: float = setting(
        300.0, "How long a launch whose token has expired waits for token_file to hold a renewed one (re-read every "
               "second) before its step fails with the token's expiry; slurmrestd refuses an expired token before "
               "it takes the job, so the job array is then submitted exactly once. 0: fail at once. An expired "
               "token from token_env fails at once.", was="rest_token_wait_seconds")

    def __post_init__(self):
        object.__setattr__(self, "forward_env", tuple(self.forward_env))
