"""The ``rest`` transport: Slurm through slurmrestd (HTTP + JWT), read from JSON, never from CLI text.

:class:`RestSlurmClient` is a :class:`~dagster_gpu.slurm.client.SlurmClient` whose methods the backend uses
(``submit_job``, ``squeue``, ``sacct``, ``sacct_steps``, ``scancel``, ``config``, ``node_gres``,
``pending_gres``, ``sdiag``, the shared poll's ``poll_query``) call slurmrestd instead of running commands;
the JSON is read by :mod:`dagster_gpu.slurm.rest_parse` into the CLI path's row types.

- **Token** (:class:`TokenSource`): a JWT from an environment variable (default ``SLURM_JWT``, Slurm's own
  name) or from a file, re-read whenever its mtime or size changes (a cron job or sidecar renews it: Slurm's
  default lifespan is 1800 s, ``scontrol token``). The file must be a regular file of this user that group
  and others cannot read or write (0600). The token travels in the ``X-SLURM-USER-TOKEN`` header (with
  ``X-SLURM-USER-NAME`` when ``user`` is set) or as ``Authorization: Bearer`` (``auth_header="bearer"``); it is
  never logged, put in a message, an argv or a job's environment.
- **Version**: the first request reads ``/openapi/v3`` and picks the newest data_parser version both sides
  know (:func:`~dagster_gpu.slurm.rest_parse.pick_version`), or the one the settings name.
- **Errors**: a connection that cannot be made or drops, a timeout, HTTP 502/503/504 or Slurm's "could not
  ask" words are transient (:class:`~dagster_gpu.slurm.client.SlurmUnreachable` /
  :class:`~dagster_gpu.slurm.client.SlurmTransientError`: retried with backoff; the poller's snapshot is an
  error and steps stay UNKNOWN, nothing fails). HTTP 401/403 is :class:`RestAuthError` naming the URL and the
  user, and saying when the token's ``exp`` has passed; never an empty queue. As slurmrestd 24.11.5 (Debian
  trixie, ``SLURM_JWT=daemon``) answers an expired or foreign token (checked on the test cluster,
  tests/test_slurm_rest.py): ``/openapi/v3`` still 200; slurmctld calls HTTP 511 with error 1007 "Protocol
  authentication error"; slurmdbd calls HTTP 502 "Failed to open slurmdbd connection, authentication error"
  (which reads like a transient "Unable to connect to database" and is not treated as one); plain 401/403
  where a proxy or rest_auth/jwt itself refuses. Other refusals are
  :class:`~dagster_gpu.slurm.client.SlurmRejected` with slurmrestd's own error text.
- **A submission under an expired token**: slurmctld refuses the RPC before it reads the job (``job/submit``
  with an expired token: HTTP 511, error 1007 "Protocol authentication error", source
  ``slurm_submit_batch_job()``; no job is created: recorded in ``tests/data/slurm/rest/v0.0.42/
  submit_expired_token.json``), so sending it again with a renewed token cannot submit twice. A launch
  (:meth:`RestSlurmClient.await_credentials`, before any of its calls) and ``job/submit`` itself (a token
  that expired while the launch was held for company) wait up to ``token_wait_s`` for the token file to
  hold a token that is not expired, logging once what they wait for (where the token comes from and when it
  expired, never the token), then submit exactly once; when the wait runs out they raise
  :class:`RestAuthError` saying so. A request that may have reached slurmctld (a read timeout, a dropped
  connection) is never sent again: only a refusal of the token is. An expired token from an environment
  variable fails at once (nothing renews a running process's environment), and so does one this process
  already waited for in vain.
- **Manifest**: slurmrestd carries no files. The job script's text goes in the submit request (``job.script``)
  and its arguments in ``job.argv``. With ``events: relay`` and ``relay_url`` nothing is shared: the job script
  carries the task runner, the manifest is uploaded under ``relay_url`` and the tasks ship their logs there
  (:mod:`dagster_gpu.slurm.object_runner`). Otherwise the manifest, the task runner and the tasks' logs stay in
  this host's spool, which must be a file system the compute nodes see at the same path (the backend says so
  when it starts). Either way the task checks the manifest's SHA-256 and batch id passed as arguments
  (``docs/security.md``), and a spool manifest's owner and mode.
- **Environment**: a job gets only what the request lists (slurmrestd has no environment of the submitter):
  this process's variables matching ``forward_env`` (default ``DAGSTER_*`` and ``PATH``; slurmctld refuses a job
  with an empty environment: "I/O error writing script/environment to file"), less any matching
  ``secret_env`` (``*PASSWORD*``, ``*SECRET*``, ``*TOKEN*``, ``*JWT*``: secrets reach tasks through the
  slurm section's ``env_files``), plus the client's ``extra_env`` (``SLURM_UMASK``).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping, Sequence
from urllib.parse import quote, urlencode

import urllib3

from dagster_gpu.slurm import gres as G
from dagster_gpu.slurm import parse as P
from dagster_gpu.slurm import rest_parse as RP
from dagster_gpu.slurm.client import (
    _TRANSIENT,
    SlurmAccessRefused,
    SlurmClient,
    SlurmRejected,
    SlurmTransientError,
    SlurmUnreachable,
    SubmittedJob,
)
from dagster_gpu.slurm.transport import NoRemoteSpool, scrubbed_env

log = logging.getLogger(__name__)

#: Names (fnmatch) never put in a job's environment by default: secrets reach tasks through env_files.
DEFAULT_SECRET_ENV = ("*PASSWORD*", "*SECRET*", "*TOKEN*", "*JWT*")
_INVALID_JOB = ("invalid job id", "unknown job", "not found")
#: Slurm error numbers in a cancel's per-job status that mean "nothing to do" (slurm/slurm_errno.h at slurm-24-11-5-1):
#: ESLURM_ALREADY_DONE and ESLURM_INVALID_JOB_ID.
_ALREADY_DONE, _INVALID_JOB_ID = 2021, 2017
#: (url, wanted version) -> the data_parser version picked for it in this process.
_PICKED: dict[tuple[str, str | None], str] = {}


class RestAuthError(SlurmAccessRefused):
    """slurmrestd refused the token (HTTP 401/403/511, or slurmdbd's authentication error): expired, signed with another key, or for another user.
    The message names the URL and the user, never the token."""


class TokenError(SlurmAccessRefused):
    """No token could be read (variable unset, file missing or readable by others)."""


@dataclass
class TokenSource:
    """Where the JWT comes from: ``file`` (re-read when it changes) if set, else environment variable ``env``."""

    env: str = "SLURM_JWT"
    file: str | None = None
    _cached: tuple[float, int, str] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: SHA-256 of an expired token this process waited for in vain (never the token itself)
    given_up_on: str | None = field(default=None, repr=False)

    def where(self) -> str:
        return f"token file {self.file}" if self.file else f"environment variable {self.env}"

    @property
    def renewable(self) -> bool:
        """Whether a renewed token can reach this process: a file is re-read, an environment variable is not."""
        return bool(self.file)

    def token(self) -> str:
        """The current token. Raises TokenError (the message names where it looked, never a token)."""
        if not self.file:
            tok = os.environ.get(self.env, "").strip()
            if not tok:
                raise TokenError(["slurmrestd"], None, f"no slurmrestd token: environment variable {self.env} is unset or empty")
            return tok
        with self._lock:
            try:
                fd = os.open(self.file, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError as e:
                raise TokenError(["slurmrestd"], None, f"cannot read the slurmrestd token file {self.file}: {e.strerror}") from None
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
                    raise TokenError(["slurmrestd"], None,
                                     f"refusing the slurmrestd token file {self.file} (owner uid {st.st_uid}, mode "
                                     f"{stat.S_IMODE(st.st_mode):04o}): it must be a regular file of uid {os.geteuid()} "
                                     "that group and others cannot read (chmod 600)")
                if self._cached and self._cached[:2] == (st.st_mtime, st.st_size):
                    return self._cached[2]
                tok = os.read(fd, 1 << 16).decode().strip()
            finally:
                os.close(fd)
            tok = tok.removeprefix("SLURM_JWT=")  # `scontrol token` prints SLURM_JWT=<token>
            if not tok:
                raise TokenError(["slurmrestd"], None, f"the slurmrestd token file {self.file} is empty")
            self._cached = (st.st_mtime, st.st_size, tok)
            return tok


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _when(exp: float) -> str:
    """``2026-12-05T13:50:01 (42 s ago)``: an ``exp`` claim for messages."""
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.localtime(exp))} ({max(0.0, time.time() - exp):.0f} s ago)"


def expired(token: str, now: float | None = None) -> float | None:
    """The ``exp`` (UNIX seconds) of ``token`` when it has passed, else None (not expired, or no ``exp``)."""
    exp = token_expiry(token)
    return exp if exp is not None and exp <= (time.time() if now is None else now) else None


def token_expiry(token: str) -> float | None:
    """The ``exp`` claim (UNIX seconds) of a JWT, read without checking its signature (only to explain a 401);
    None when the token is not a JWT with one."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


@dataclass
class RestTransport(NoRemoteSpool):
    """The client's transport (:class:`~dagster_gpu.slurm.transport.Transport`) over slurmrestd: no remote
    spool (the spool must be a file system the compute nodes see), so upload, tail and read_from raise
    TransportUnavailable; Slurm commands do not run through it (:meth:`run` raises SlurmRejected)."""

    url: str
    kind: str = "rest"

    def run(self, argv, *, set_env, timeout_s, forward_env=False):
        raise SlurmRejected(list(argv), None, f"transport rest ({self.url}) runs no Slurm commands; "
                            f"{argv[0] if argv else '?'} has no slurmrestd call here")


@dataclass
class RestSlurmClient(SlurmClient):
    """A SlurmClient over slurmrestd (see module doc).

    Attributes (besides SlurmClient's):
        url: slurmrestd's base URL (``http://127.0.0.1:6820``, ``https://slurm.example.org``).
        user: the Slurm user the token is for (``X-SLURM-USER-NAME``), or None for a token that names it.
        tokens: the :class:`TokenSource`.
        auth_header: ``x-slurm`` (``X-SLURM-USER-TOKEN``) or ``bearer`` (``Authorization: Bearer``).
        version: data_parser version to use (``v0.0.42``), or None to pick from ``/openapi/v3``.
        max_array_size_assumed: MaxArraySize assumed (slurmrestd does not serve slurm.conf; Slurm's default 1001).
        forward_env / secret_env: see module doc.
        working_dir: the jobs' working directory on the cluster.
        ca_file: CA bundle for an https URL (None: the system's).
        token_wait_s: how long a submission whose token has expired waits for the token file to be renewed
            (seconds; 0: it fails at once). See the module doc.
        token_poll_s: seconds between two reads of the token file while waiting.
    """

    url: str = "http://127.0.0.1:6820"
    user: str | None = None
    tokens: TokenSource = field(default_factory=TokenSource)
    auth_header: str = "x-slurm"
    version: str | None = None
    max_array_size_assumed: int = 1001
    forward_env: Sequence[str] = ("DAGSTER_*", "PATH")
    secret_env: Sequence[str] = DEFAULT_SECRET_ENV
    working_dir: str = "/tmp"
    ca_file: str | None = None
    token_wait_s: float = 300.0
    token_poll_s: float = 1.0
    http: Any = field(default=None, repr=False, compare=False)
    _picked: str | None = field(default=None, init=False, repr=False, compare=False)
    _release: str = field(default="", init=False, repr=False, compare=False)
    _warned_secret: set = field(default_factory=set, init=False, repr=False, compare=False)

    poll_format: ClassVar[str] = "rest"

    def __post_init__(self):
        self.url = self.url.rstrip("/")
        if self.auth_header not in ("x-slurm", "bearer"):
            raise ValueError(f"rest auth_header must be 'x-slurm' or 'bearer', got {self.auth_header!r}")
        if self.http is None:
            kw = {"ca_certs": self.ca_file} if self.ca_file else {}
            self.http = urllib3.PoolManager(num_pools=2, maxsize=4, retries=False, **kw)
        self.transport = RestTransport(self.url)

    # ------------------------------------------------------------------------------------ HTTP
    def _headers(self) -> dict[str, str]:
        tok = self.tokens.token()
        h = {"Accept": "application/json", "Content-Type": "application/json"}
        if self.auth_header == "bearer":
            h["Authorization"] = f"Bearer {tok}"
        else:
            h["X-SLURM-USER-TOKEN"] = tok
        if self.user:
            h["X-SLURM-USER-NAME"] = self.user
        return h

    def _who(self) -> str:
        return f"user {self.user}" if self.user else "the token's user"

    def _once(self, method: str, path: str, query: Mapping[str, Any] | None = None, body: Any = None,
              ok_missing: bool = False) -> dict:
        """One request; returns the JSON document. Raises SlurmUnreachable, SlurmTransientError, RestAuthError,
        SlurmRejected (``ok_missing``: an unknown job id gives ``{}`` instead)."""
        what = f"{method} {path}"
        self.calls["slurmrestd"] = self.calls.get("slurmrestd", 0) + 1
        argv = ["slurmrestd", what]
        url = self.url + path + (f"?{urlencode(query)}" if query else "")
        headers = self._headers()
        try:
            r = self.http.request(method, url, headers=headers, body=json.dumps(body) if body is not None else None,
                                  timeout=urllib3.Timeout(connect=min(10.0, self.timeout_s), read=self.timeout_s),
                                  redirect=False)
        except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError, urllib3.exceptions.NameResolutionError) as e:
            err = SlurmUnreachable(argv, None, f"slurmrestd {self.url} unreachable: {type(e).__name__}")
            err.sent = False
            raise err from None
        except urllib3.exceptions.HTTPError as e:  # read timeout, connection dropped mid-request
            err = SlurmUnreachable(argv, None, f"slurmrestd {self.url}: {type(e).__name__} during {what}")
            err.sent = True
            raise err from None
        if r.status in (401, 403, 511):
            raise RestAuthError(argv, r.status, self._auth_message(r.status, what))
        try:
            doc = json.loads(r.data.decode("utf-8", "replace")) if r.data else {}
        except ValueError:
            doc = {"errors": [{"description": r.data.decode("utf-8", "replace").strip()[:300]}]}
        if not isinstance(doc, dict):
            doc = {"errors": [{"description": "not a JSON object"}]}
        text = RP.error_text(doc)
        if self._release == "" and RP.slurm_release(doc):
            self._release = RP.slurm_release(doc)
        if r.status >= 400 or text:
            low = text.lower()
            if "authentication error" in low:  # slurmdbd refused the token (HTTP 502; see module doc)
                raise RestAuthError(argv, r.status, self._auth_message(r.status, what))
            if ok_missing and any(w in low for w in _INVALID_JOB):
                return {}
            msg = f"slurmrestd {what}: HTTP {r.status}: {text or r.reason}"
            if r.status in (502, 503, 504) or _TRANSIENT.search(text):
                raise SlurmTransientError(argv, r.status, msg, text)
            if r.status >= 400 or not (doc.get("jobs") or doc.get("job_id")):
                raise SlurmRejected(argv, r.status, msg, text)
            log.warning("%s", msg)  # errors beside a result: keep the result
        return doc

    def _auth_message(self, status: int, what: str) -> str:
        base = f"slurmrestd {self.url} refused the token of {self._who()} ({self.tokens.where()}) for {what}: HTTP {status}"
        try:
            exp = token_expiry(self.tokens.token())
        except SlurmAccessRefused:
            exp = None
        if exp is not None and exp <= time.time():
            return f"{base}: the token expired at {_when(exp)}; renew it (scontrol token lifespan=<s> username=<user>)"
        return f"{base}: the token is not valid for this server or user (not signed with its jwt_key, or another user's)"

    # ------------------------------------------------------------------------------------ an expired token
    def await_credentials(self, what: str) -> None:
        """Before a submission's first call: return at once when the token has not expired (or has no ``exp``);
        else wait for a renewed one (see :meth:`_await_renewal`). ``what`` names the submission for the log
        (``the launch of step 'embed' (partition 'a')``). Raises RestAuthError (expired and not renewed within
        :attr:`token_wait_s`), TokenError (no token to read when it starts)."""
        tok = self.tokens.token()
        if expired(tok) is not None:
            self._await_renewal(tok, what, time.monotonic() + self.token_wait_s)

    def _await_renewal(self, stale: str, what: str, deadline: float, status: int | None = None) -> str:
        """Wait until the token source holds a token other than ``stale`` that has not expired, reading it every
        :attr:`token_poll_s` until ``deadline`` (``time.monotonic()``); returns it. Logs one WARNING when it starts
        (where the token comes from, when it expired, how long it waits) and one INFO when it ends. A token file
        that is missing, empty or being rewritten counts as not renewed yet. Raises RestAuthError (``status``: the
        refusal's HTTP status, None before any request) at once for an environment variable, or for a token this
        process already waited for in vain; when ``deadline`` passes."""
        argv = ["slurmrestd", what]
        exp = token_expiry(stale) or 0.0
        base = f"slurmrestd {self.url}: the token of {self._who()} ({self.tokens.where()}) expired at {_when(exp)}"
        if not self.tokens.renewable:
            raise RestAuthError(argv, status, f"{base}, before {what}; an environment variable is not renewed under a "
                                "running process: renew the token and start again, or use slurm.rest.token_file (re-read "
                                "when it changes)")
        if self.tokens.given_up_on == _digest(stale):
            raise RestAuthError(argv, status, f"{base}, before {what}; this process already waited for it to be renewed "
                                "in vain: renew it (scontrol token lifespan=<s> username=<user>)")
        wait_s = max(0.0, deadline - time.monotonic())
        log.warning("%s: waiting up to %.0f s for it to be renewed before %s", base, wait_s, what)
        t0 = time.monotonic()
        while True:
            try:
                tok = self.tokens.token()
            except TokenError:
                tok = stale  # missing or empty while a renewal rewrites it
            if tok != stale and expired(tok) is None:
                log.info("slurmrestd %s: the token in %s was renewed after %.1f s; going on with %s", self.url,
                         self.tokens.where(), time.monotonic() - t0, what)
                return tok
            left = deadline - time.monotonic()
            if left <= 0:
                self.tokens.given_up_on = _digest(stale)
                raise RestAuthError(argv, status, f"{base}; it was not renewed within {self.token_wait_s:g} s "
                                    f"(slurm.rest.token_wait_seconds), so {what} failed and nothing was submitted: renew it "
                                    "(scontrol token lifespan=<s> username=<user>)")
            time.sleep(min(self.token_poll_s, left))

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
                attempts: int | None = None, only_unsent: bool = False, ok_missing: bool = False) -> dict:
        """One slurmrestd call, retried while transient (see :meth:`SlurmClient.retried`). ``path`` is
        relative to the versioned prefix when it starts with ``slurm/`` or ``slurmdb/`` (``slurm/jobs/`` ->
        ``/slurm/v0.0.42/jobs/``), else used as is."""
        if path.startswith(("slurm/", "slurmdb/")):
            kind, _, rest = path.partition("/")
            path = f"/{kind}/{self.data_parser()}/{rest}"
        return self.retried(f"slurmrestd {method} {path}", lambda: self._once(method, path, query, body, ok_missing),
                            attempts=attempts, only_unsent=only_unsent)

    def data_parser(self) -> str:
        """The data_parser version in use (picked from ``/openapi/v3`` on this process's first use for this URL,
        then kept: the description is 1.6 MB on 24.11, and a copy of the client, as the coalescer makes for each
        submission, must not fetch it again). Raises SlurmRejected when the server serves none this client reads."""
        if self._picked is None:
            self._picked = _PICKED.get((self.url, self.version))
        if self._picked is None:
            doc = self.retried("slurmrestd GET /openapi/v3", lambda: self._once("GET", "/openapi/v3"))
            served = RP.served_versions(doc)
            try:
                self._picked = RP.pick_version(served, wanted=self.version)
            except RP.NoCommonVersion as e:
                raise SlurmRejected(["slurmrestd", "GET /openapi/v3"], None, f"{self.url}: {e}") from None
            log.info("slurmrestd %s: data_parser %s (served: %s)", self.url, self._picked, ", ".join(served))
            _PICKED[(self.url, self.version)] = self._picked
        return self._picked

    # ------------------------------------------------------------------------------------ submit / cancel
    def job_environment(self) -> dict[str, str]:
        """The environment a submitted job gets (see module doc)."""
        env = scrubbed_env(os.environ)
        out = {}
        for k, v in env.items():
            if not any(fnmatch.fnmatchcase(k, p) for p in self.forward_env):
                continue
            if any(fnmatch.fnmatchcase(k.upper(), p) for p in self.secret_env):
                if k not in self._warned_secret:
                    self._warned_secret.add(k)
                    log.warning("slurmrestd: %s is not put in the job's environment (a secret: give it to tasks "
                                "through the slurm section's env_files)", k)
                continue
            out[k] = v
        out.update(self.set_env())
        out.pop("SLURM_CONF", None)  # the cluster's own
        return out

    def submit_job(self, script: str | Path, options: Sequence[str], *, script_args: Sequence[str] = (),
                   attempts: int | None = None) -> SubmittedJob:
        """``job/submit`` of the script at ``script`` (its text is sent) with ``options`` (sbatch argv items,
        :func:`~dagster_gpu.slurm.rest_parse.job_description`) and ``script_args``. Retried only when the
        request surely never left, or when slurmrestd refused the token and the token file then holds a renewed
        one (a refused token submits nothing: see the module doc); an expired token is waited for up to
        :attr:`token_wait_s`. Raises SlurmRejected with slurmrestd's reason, RestAuthError."""
        text = Path(script).read_text()
        try:
            body = RP.job_description(options, text, [str(script), *script_args], self.job_environment(), self.working_dir)
        except RP.UnsupportedOption as e:
            raise SlurmRejected(["slurmrestd", "job/submit"], None, str(e)) from None
        what = "job/submit"
        deadline = time.monotonic() + self.token_wait_s
        sent = self.tokens.token()
        if expired(sent) is not None:
            sent = self._await_renewal(sent, what, deadline)
        for _ in range(4):  # a try after a refusal only with another token: bounded by the deadline and this count
            try:
                doc = self.request("POST", "slurm/job/submit", body=body, attempts=attempts, only_unsent=True)
                break
            except RestAuthError as e:
                now_tok = self.tokens.token()
                if expired(now_tok) is not None:  # refused because it expired (meanwhile): nothing was submitted
                    sent = self._await_renewal(now_tok, what, deadline, e.returncode)
                elif now_tok != sent:  # renewed while the request was refused: send it again with the new one
                    sent = now_tok
                else:
                    raise
        else:
            raise RestAuthError(["slurmrestd", what], None, f"slurmrestd {self.url} refused every renewed token of "
                                f"{self._who()} ({self.tokens.where()}) for {what}")
        try:
            return SubmittedJob(RP.submitted_job_id(doc), None)
        except P.SlurmParseError as e:
            raise SlurmRejected(["slurmrestd", "job/submit"], None, str(e)) from None

    def scancel(self, ids: Iterable[str], *, signal: str | None = None, cluster: str | None = None) -> None:
        """``DELETE job/<id>`` for each id (``123_7`` one array task, ``123`` the whole array; ``signal``
        when given). Unknown ids (HTTP 404 "Invalid job id specified") and ended ones (a ``status`` entry with
        error 2021, "Job/step already completing or completed", in an HTTP 200 answer: slurmrestd 24.11.5) are
        ignored; any other per-job error raises SlurmRejected with its text."""
        for i in [str(i) for i in ids]:
            q = {"signal": signal} if signal else None
            doc = self.request("DELETE", f"slurm/job/{quote(i, safe='')}", query=q, ok_missing=True)
            for st in doc.get("status") or []:
                err = (st or {}).get("error") or {}
                if err.get("code") not in (None, 0, _ALREADY_DONE, _INVALID_JOB_ID):
                    raise SlurmRejected(["slurmrestd", f"DELETE job/{i}"], None,
                                        f"slurmrestd could not cancel {i}: {err.get('message') or err.get('string') or err}")

    def array_limits(self) -> P.ArrayLimits:
        """MaxArraySize as :attr:`max_array_size_assumed` (slurmrestd does not serve slurm.conf), asking nothing:
        a launch's flush of the spool needs no call besides ``job/submit``."""
        return P.ArrayLimits(int(self.max_array_size_assumed))

    def test_only(self, options: Sequence[str], script: str | Path) -> P.TestOnly:
        """Not offered by slurmrestd: raises SlurmRejected (the what-if estimate then has no start delay)."""
        raise SlurmRejected(["slurmrestd", "test-only"], None, "slurmrestd has no sbatch --test-only")

    # ------------------------------------------------------------------------------------ reads
    def _queue_docs(self, job_ids: Iterable[int | str], attempts: int | None = None) -> list[dict]:
        return [self.request("GET", f"slurm/job/{int(str(j).split('_')[0])}", attempts=attempts, ok_missing=True)
                for j in sorted({str(j).split("_")[0] for j in job_ids}, key=int)]

    def _acct_docs(self, job_ids: Iterable[int | str], attempts: int | None = None, steps: bool = False) -> list[dict]:
        # without the steps (a third less JSON, measured: docs/benchmarks.md) unless their usage is what is read
        q = {"show_duplicates": "true", "skip_steps": "true"} if not steps else {}
        return [self.request("GET", "slurmdb/jobs/", query={"step": str(j), **q}, attempts=attempts)
                for j in sorted({str(j).split("_")[0] for j in job_ids}, key=int)]

    def squeue(self, job_ids: Iterable[int | str], *, attempts: int | None = None, cluster: str | None = None) -> list[P.QueueRow]:
        """``job/<array job id>`` per id: every task Slurm still holds (purged ids are absent). Empty -> [].
        Not ``jobs/state``: it is 40x cheaper (docs/benchmarks.md) but has no state reason or start time, which the
        state logic reads for every pending and running task, the only ones an active array has."""
        return [r for d in self._queue_docs(job_ids, attempts) for r in RP.queue_rows(d)]

    def sacct(self, job_ids: Iterable[int | str], *, attempts: int | None = None, cluster: str | None = None) -> list[P.AcctRow]:
        """``slurmdb/jobs/?step=<id>&show_duplicates&skip_steps`` per id: one row per attempt. Empty -> []."""
        return [r for d in self._acct_docs(job_ids, attempts) for r in RP.acct_rows(d)]

    def sacct_steps(self, job_ids: Iterable[int | str], *, cluster: str | None = None) -> list[P.StepUsage]:
        """The steps' usage TRES of ``job_ids`` from ``slurmdb/jobs``."""
        return [s for d in self._acct_docs(job_ids, steps=True) for s in RP.step_usage(d)]

    def poll_query(self, job_ids: Sequence[int], cluster: str | None = None) -> tuple[str, str]:
        """(queue, accounting) for the shared poll: the slurmrestd responses, one compact JSON document per line."""
        q = "".join(json.dumps({"jobs": d.get("jobs") or []}, separators=(",", ":")) + "\n" for d in self._queue_docs(job_ids, 2))
        a = "".join(json.dumps({"jobs": d.get("jobs") or []}, separators=(",", ":")) + "\n" for d in self._acct_docs(job_ids, 2))
        return q, a

    def show_config(self) -> dict[str, str]:
        """What the backend reads of ``scontrol show config``, from what slurmrestd serves: AccountingStorageTRES
        (``slurmdb/tres/``), SLURM_VERSION (``meta.slurm.release``), MaxArraySize (:attr:`max_array_size_assumed`:
        slurmrestd does not serve slurm.conf)."""
        doc = self.request("GET", "slurmdb/tres/")
        return {"AccountingStorageTRES": ",".join(RP.tracked_tres(doc)),
                "SLURM_VERSION": RP.slurm_release(doc) or self._release,
                "MaxArraySize": str(self.max_array_size_assumed)}

    def node_gres(self, slurm_partition: str | None) -> list[G.NodeGres]:
        """``nodes/``: every node of the slurm partition (all when None) with its state and GRES."""
        return RP.node_gres(self.request("GET", "slurm/nodes/"), slurm_partition)

    def pending_gres(self, slurm_partition: str | None) -> list[str]:
        """``jobs/``: the tres-per-node of every pending job and array task in the slurm partition."""
        return RP.pending_tres_per_node(self.request("GET", "slurm/jobs/"), slurm_partition)

    def update_throttle(self, array_job_id: int, throttle: int) -> None:
        """Not offered through this client's slurmrestd calls: raises SlurmRejected."""
        raise SlurmRejected(["slurmrestd", "job update"], None, "changing an array's throttle is not done over slurmrestd here")

    def sdiag(self) -> P.Sdiag:
        """``diag/``: the job counters (RPC counts are not read)."""
        d = self.request("GET", "slurm/diag/").get("statistics") or {}
        n = lambda k: RP.number(d.get(k)) or 0  # noqa: E731
        return P.Sdiag(jobs_submitted=n("jobs_submitted"), jobs_started=n("jobs_started"), jobs_completed=n("jobs_completed"),
                       jobs_canceled=n("jobs_canceled"), jobs_failed=n("jobs_failed"))

    def sdiag_reset(self) -> None:
        raise SlurmRejected(["slurmrestd", "diag reset"], None, "slurmrestd cannot reset sdiag")


def client_from_settings(settings, **client_kw) -> RestSlurmClient:
    """The :class:`RestSlurmClient` a :class:`~dagster_gpu.slurm.settings.SlurmSettings` with ``transport: rest``
    asks for, from its ``rest`` section. Raises ValueError for missing or bad settings."""
    rest = settings.rest
    if not rest.url:
        raise ValueError("slurm transport 'rest' needs slurm.rest.url (slurmrestd's base URL, e.g. http://127.0.0.1:6820)")
    if not rest.url.startswith(("http://", "https://")):
        raise ValueError(f"slurm.rest.url must start with http:// or https://, got {rest.url!r}")
    if settings.ssh.remote_spool_dir:
        raise ValueError("slurm transport 'rest' carries no files: leave slurm.ssh.remote_spool_dir unset and set "
                         "events: relay with slurm.relay_url (nothing shared), or put spool_dir on a file system the "
                         "compute nodes see at the same path")
    return RestSlurmClient(
        url=rest.url, user=rest.user,
        tokens=TokenSource(env=rest.token_env, file=os.path.expanduser(rest.token_file) if rest.token_file else None),
        auth_header=rest.auth_header, version=rest.data_parser,
        max_array_size_assumed=int(rest.max_array_size), forward_env=tuple(rest.forward_env),
        working_dir=rest.working_dir, ca_file=rest.ca_file,
        token_wait_s=float(rest.token_wait_seconds), **client_kw,
    )  # fmt: skip
