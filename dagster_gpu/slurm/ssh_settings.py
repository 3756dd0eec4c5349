"""The ``slurm.ssh:`` section: how ``transport: ssh`` reaches the login node and the spool there
(:func:`dagster_gpu.slurm.ssh.transport_from_settings` builds the transport from it)."""

from __future__ import annotations

from dataclasses import dataclass

from dagster_gpu.settings.schema import setting


@dataclass(frozen=True)
class SlurmSshSettings:
    """The ``ssh:`` section of the ``slurm:`` section, typed (its defaults are written here only)."""

    host: str | None = setting(None, "The login node.", was="ssh_host")
    user: str | None = setting(None, "Login name (default: OpenSSH's, or ~/.ssh/config's with config: true).",
                               was="ssh_user")
    port: int = setting(22, "TCP port.", was="ssh_port")
    identity_file: str | None = setting(None, "Private key (default: the ssh agent's keys); a passphrase must be in "
                                              "the agent, nothing prompts.", was="ssh_identity_file")
    known_hosts_file: str | None = setting(None, "known_hosts file the login node's key is checked against, strictly "
                                                 "(required unless config: true).", was="ssh_known_hosts_file")
    proxy_jump: str | None = setting(None, "ProxyJump (a bastion), e.g. user@bastion:22.", was="ssh_proxy_jump")
    config: bool = setting(False, "Read ~/.ssh/config for the host (certificates, Kerberos, ProxyJump, User, "
                                  "IdentityFile); default: only these settings (-F none).", was="ssh_config")
    control_dir: str | None = setting(None, "Directory of the shared ControlMaster socket (default "
                                            "$XDG_RUNTIME_DIR/dagster-gpu-ssh, else /tmp/dagster-gpu-ssh-<uid>).",
                                      was="ssh_control_dir")
    forward_env: tuple[str, ...] = setting(("DAGSTER_*",), "This process's variables (fnmatch patterns) array tasks "
                                                           "inherit, sent on sbatch's stdin.", was="ssh_forward_env")
    remote_spool_dir: str | None = setting(None, "The spool on the cluster (manifests, job script, task logs; a path "
                                                 "compute nodes see); default: slurm.spool_dir.", was="remote_spool_dir")

    def __post_init__(self):
        object.__setattr__(self, "forward_env", tuple(self.forward_env))
