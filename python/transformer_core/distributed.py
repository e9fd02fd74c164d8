"""The corpus embedding job of :mod:`transformer_core.corpus` on a Dask distributed cluster.

:func:`embed_corpus` cuts the input into the same chunks as :func:`transformer_core.corpus.embed_file`
and runs each as a task on the cluster's workers; a task embeds its chunk and writes it as one part
of the same Parquet dataset (``part-<chunk>.parquet``, written to a temp name and renamed). The
client streams the input (at most ``max_in_flight`` chunks submitted and not yet done), records
each chunk in the same manifest as it completes, and renames the dataset to its final name at the
end: an output is the same whether one process or a cluster made it, and either can resume the
other's interrupted run. The client holds the output's lock from the run's start to its end
(:meth:`transformer_core.corpus.EmbedJob.start`): a second run of the same output, distributed or
not, is refused while it runs.

* **The client's memory** is bounded by the chunks in flight, not by the corpus: Dask keeps a copy
  of the recent messages of each connection (``BatchedSend.recent_message_log``: the last
  ``distributed.admin.low-level-log-length`` messages under 1 MB, 1000 by default), and a chunk's
  texts travel in such messages, so the connections that :func:`embed_corpus` makes (its Client,
  and its own local cluster's scheduler, which runs in this process) are built and run with that
  length set to :data:`DASK_LOG_LENGTH` (0, no copies). A ``distributed.Client`` given as
  ``scheduler`` keeps the settings it was built with: see :func:`embed_corpus`.

* **One encoder per worker**, not per task: a worker plugin loads the model when the worker starts
  (and in a worker that replaces a dead one) into a per-process cache keyed by the model's
  fingerprint; tasks take it from there. A worker's tasks use its encoder one at a time (a lock).
  On a cluster that outlives the job (a ``scheduler`` address's, a given Client's) the plugin is
  unregistered when the job ends, which drops the workers' encoder: later workers load nothing.
  The workers get a local model path as an absolute path (resolved in the client).
* **Threads**: each worker's C++ core runs ``threads_per_worker`` OpenMP threads
  (``transformer_core.set_num_threads``, and ``OMP_NUM_THREADS`` in its environment), by default
  the host's cores divided by the worker processes on that host, so that the workers together do
  not oversubscribe the cores. The workers on each host are counted once, when the job starts: a
  worker that joins later (adaptive scaling, ``cluster.scale``) on a host that had none takes the
  largest count seen on a host, or all of its host's cores (and those there already keep theirs),
  so pass ``threads_per_worker`` for a cluster that grows. A local cluster's workers run one Dask
  task thread each. A worker that runs in the client's own process
  (``LocalCluster(processes=False)``) keeps the caller's thread count and environment: the thread
  count is process-wide, and the job does not change the caller's. The thread count and
  ``OMP_NUM_THREADS`` set in a worker process stay after the job.
* **Failures**: tasks are idempotent per chunk (same chunk, same part file, atomic rename), so the
  chunks of a worker that dies are recomputed on another worker (Dask reschedules them) with no
  row lost or duplicated.
* **Stale tasks**: cancelling a future does not stop a task that is already running. Each task
  carries its run's id and writes its part only into the directory that holds that run's marker
  (:func:`transformer_core.corpus.write_parquet_part` with ``run=``), so a task of an interrupted
  run that ends after another run replaced (``overwrite``) or resumed the output writes nothing
  there (it fails with ESTALE, which nobody waits for), and the next run's output holds exactly
  its own rows. Each part records the run that wrote it, checked against the manifest's runs when
  a run is resumed and when it finishes.
* **Bits**: a task encodes its chunk exactly as :func:`transformer_core.corpus.embed_file` does
  (the same chunks, ``batch_size`` and L2 normalisation, the manifest's ``normalize``, whatever
  the model's own setting), so the rows are bitwise those of a single-process run.

The workers need transformer_core, pyarrow and the model, and must see the output directory (a
shared file system on a multi-machine cluster); the input is read by the client only and its texts
travel with the tasks.

Needs ``dask[distributed]`` and pyarrow: ``pip install 'transformer_core[distributed]'``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Callable

try:
    import dask
    from distributed import Client, LocalCluster, as_completed
    from distributed.client import FutureCancelledError
    from distributed.comm import CommClosedError, get_address_host, parse_address
    from distributed.comm.registry import get_backend
    from distributed.deploy.spec import SpecCluster
    from distributed.diagnostics.plugin import WorkerPlugin
    from distributed.scheduler import KilledWorker
except ImportError as e:
    raise ImportError(f"transformer_core.distributed needs dask[distributed] ({e}): "
                      f"pip install 'transformer_core[distributed]'") from e

from . import corpus
from ._runtime import core
from ._validation import MAX_SIZE, check_int
from .hub import DEFAULT_MODEL

__all__ = ["embed_corpus", "EncoderPlugin", "MAX_WORKERS", "DASK_LOG_LENGTH"]

#: ``distributed.admin.low-level-log-length`` while :func:`embed_corpus` runs on connections it
#: makes: how many recent messages Dask keeps a copy of per connection (and per developer log:
#: the scheduler's transitions and events, a worker's stimuli). 0 keeps none, so that the texts of
#: the chunks already sent are not kept in this process (Dask's default, 1000, kept up to 1000
#: chunks per connection: the whole of most corpora, once per connection).
DASK_LOG_LENGTH = 0
_LOG_LENGTH_KEY = "distributed.admin.low-level-log-length"
_dask_jobs = 0  # the jobs in this process that hold Dask's settings (threads may overlap)
_dask_restore = None  # restores what _job_dask_settings changed, held from the first such job to the last
_dask_lock = threading.Lock()


@contextlib.contextmanager
def _job_dask_settings():
    """Dask's settings of a job in this process while the block runs, restored when the last of
    the overlapping blocks (jobs in several threads) ends (a ``dask.config.set`` per job would
    restore what it found on entry, and overlapping jobs ending out of order would leave the
    process's settings as a job set them):

    - ``DASK_LOG_LENGTH`` as the message log length (read where each connection is built);
    - no "Sending large graph" UserWarning for a chunk of over 10 MB of text
      (``distributed.admin.large-graph-warning-threshold``);
    - the ``distributed`` loggers at CRITICAL, so that what the job reports itself (a lost
      scheduler: an OSError; a killed worker: survived) is not also Dask's ERROR lines and
      tracebacks on stderr (the CLI's one line)."""
    global _dask_jobs, _dask_restore
    with _dask_lock:
        if _dask_jobs == 0:
            setting = dask.config.set({_LOG_LENGTH_KEY: DASK_LOG_LENGTH,
                                       "distributed.admin.large-graph-warning-threshold": 2**62})
            loggers = [logging.getLogger(name) for name in list(logging.Logger.manager.loggerDict)
                       if name == "distributed" or name.startswith("distributed.")]
            loggers = [logger for logger in loggers if isinstance(logger, logging.Logger)]
            levels = [(logger, logger.level) for logger in [logging.getLogger("distributed"), *loggers]]
            for logger, _ in levels:
                logger.setLevel(logging.CRITICAL)

            def restore():
                """Puts back the loggers' levels and Dask's settings as the first job found them."""
                for logger, level in levels:
                    logger.setLevel(level)
                setting.__exit__(None, None, None)

            _dask_restore = restore
        _dask_jobs += 1
    try:
        yield
    finally:
        with _dask_lock:
            _dask_jobs -= 1
            if _dask_jobs == 0:
                _dask_restore()
                _dask_restore = None


#: The most worker processes :func:`embed_corpus` starts in a local cluster (``workers``): each is
#: a process holding its own copy of the model, so more than this only exhausts the machine.
MAX_WORKERS = 1024

# The encoder of this worker process: fingerprint -> (SentenceEncoder, lock).
_ENCODERS: dict = {}
_ENCODERS_LOCK = threading.Lock()
# The plugins set up in this worker process that use each encoder: fingerprint -> count.
_ENCODER_USERS: Counter = Counter()
# This process, as a worker plugin can tell it from the client's: the same value in an in-process
# worker (LocalCluster(processes=False)), another in any worker process (spawned or forked).
_THIS_PROCESS = uuid.uuid4().hex


def _process_id() -> tuple[str, int]:
    """This process's identity (a random id taken at import, and the pid: a forked child differs)."""
    return _THIS_PROCESS, os.getpid()


def _cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _worker_model(model) -> str:
    """The name the workers load ``model`` by: the absolute path of a model directory or file that
    this process finds (a relative one, or one with ``~``, meant this process's directory and
    home, not a worker's), else ``model`` itself (an embedded model's name)."""
    from .hub import _path_text, expand_home

    text = _path_text(model, "model")
    path = expand_home(text, "model")
    if path.is_dir() or path.is_file():
        return str(path.resolve())
    return text


def _this_worker() -> str:
    """The address of the Dask worker this code runs in ("?" outside one)."""
    try:
        from distributed import get_worker

        return get_worker().address
    except ValueError:  # not in a worker
        return "?"


def _worker_encoder(model: str, fingerprint: str, worker: str | None = None):
    """This process's encoder for ``model`` (loaded on first use), and the lock its users take.
    ``worker``: the worker's address, for the errors (default: the worker this runs in).

    Raises:
        ValueError: the model found here under that name is not the client's (another fingerprint),
            or cannot be loaded here. FileNotFoundError: no such model here. OSError: its files
            cannot be read here. Each names ``model`` and the worker: the client has loaded the
            same ``model``, and the workers must see it too.
    """
    with _ENCODERS_LOCK:
        entry = _ENCODERS.get(fingerprint)
        if entry is None:
            from .sentence_encoder import SentenceEncoder

            where = f"worker {worker or _this_worker()} (pid {os.getpid()})"
            try:
                found = corpus.model_identity(model)["fingerprint"]
                if found == fingerprint:
                    entry = (SentenceEncoder.from_pretrained(model), threading.Lock())
            except (OSError, ValueError) as e:
                kind = next(k for k in (FileNotFoundError, OSError, ValueError) if isinstance(e, k))
                raise kind(f"model: {model!r} cannot be loaded on {where}: {e}; the workers must see the same "
                              f"model as the client") from None
            if entry is None:
                raise ValueError(f"model: {model!r} on {where} has fingerprint {found[:12]}, the client's has "
                                 f"{fingerprint[:12]}: the workers must have the same model")
            _ENCODERS[fingerprint] = entry
        return entry


class EncoderPlugin(WorkerPlugin):
    """Worker plugin: sets the worker's C++ threads and loads the encoder once, at worker start.

    Args:
        model: model directory or embedded name (as the workers see it).
        fingerprint: :func:`transformer_core.corpus.model_identity`'s fingerprint of the client's model.
        threads: OpenMP threads per worker; None = the host's cores / ``workers_per_host[host]``
            (a host not in it: the largest count in it).
        workers_per_host: worker processes per host (by address), from the scheduler when the
            job starts (not updated as workers join).

    A worker in the process that made the plugin (an in-process cluster's, in the client) leaves
    that process's thread count and ``OMP_NUM_THREADS`` as they are: they are the caller's.
    :func:`embed_corpus` unregisters it from a cluster that outlives the job; its ``teardown``
    then drops the worker's encoder (unless another job's plugin of the same model still holds it).
    The thread count and ``OMP_NUM_THREADS`` it set stay.
    """

    idempotent = False

    def __init__(self, model: str, fingerprint: str, threads: int | None = None,
                 workers_per_host: dict[str, int] | None = None):
        self.model = model
        self.fingerprint = fingerprint
        self.threads = threads
        self.workers_per_host = dict(workers_per_host or {})
        self.client_process = _process_id()

    def threads_for(self, address: str) -> int:
        """The OpenMP threads of the worker at ``address``."""
        if self.threads:
            return self.threads
        per_host = self.workers_per_host.get(get_address_host(address),
                                             max(self.workers_per_host.values(), default=1))
        return max(1, _cores() // max(1, per_host))

    def setup(self, worker) -> None:
        """Dask's ``WorkerPlugin`` hook, run once on each worker as it joins: sets the worker's
        OpenMP threads (:meth:`threads_for`; not in the client's own process) and loads its encoder
        (checked against the fingerprint)."""
        import transformer_core

        if self.client_process != _process_id():
            n = self.threads_for(worker.address)
            os.environ["OMP_NUM_THREADS"] = str(n)  # for anything this worker spawns
            transformer_core.set_num_threads(n)
        _worker_encoder(self.model, self.fingerprint, worker.address)
        with _ENCODERS_LOCK:
            _ENCODER_USERS[self.fingerprint] += 1
        self.set_up = True  # this worker's copy of the plugin (or the in-process workers' one)

    def teardown(self, worker) -> None:
        """Dask's ``WorkerPlugin`` hook, run when the plugin is unregistered (and when the worker
        closes): drops the worker's encoder once no other job's plugin uses it."""
        if not getattr(self, "set_up", False):  # its setup failed: it holds no encoder
            return
        with _ENCODERS_LOCK:
            _ENCODER_USERS[self.fingerprint] -= 1
            if _ENCODER_USERS[self.fingerprint] <= 0:
                del _ENCODER_USERS[self.fingerprint]
                _ENCODERS.pop(self.fingerprint, None)


def _embed_chunk(model: str, fingerprint: str, directory: str, run: str, index: int, width: int, start: int,
                 texts: list, batch_size: int, normalize: bool) -> tuple[int, int]:
    """The task: embeds one chunk with this worker's encoder (as ``embed_file`` does: ``batch_size``,
    ``normalize``), writes its Parquet part into ``directory`` if it is still the data of ``run``.
    Idempotent.

    Raises:
        OSError: ESTALE: the run is no longer current (checked before the work and at the write).
    """
    corpus._check_run(None, Path(directory), run, Path(directory) / corpus._part_name(index, width))
    encoder, lock = _worker_encoder(model, fingerprint)
    with lock:
        emb = encoder.encode(texts, batch_size=batch_size, normalize=normalize, progress=False)
    corpus.write_parquet_part(directory, index, width, start, texts, emb, run=run)
    return index, len(texts)


def _check_scheduler(scheduler, workers) -> None:
    """``scheduler`` and ``workers`` as :func:`embed_corpus` takes them, checked without connecting:
    not both, a ``Client`` or an address Dask can parse (a known scheme; a port for an IP one).

    Raises:
        ValueError: both given; a malformed address; a closed Client (or one whose LocalCluster
            is closed) (naming ``scheduler``). TypeError: a ``scheduler`` that is neither a str
            nor a Client.
    """
    if scheduler is not None and workers is not None:
        raise ValueError("scheduler and workers: give one (workers starts a local cluster)")
    if isinstance(scheduler, Client):
        if scheduler.status in ("closing", "closed"):  # itself closed, or its LocalCluster closed
            raise ValueError(f"scheduler: expected a running Client, got one that is {scheduler.status}")
        return
    if scheduler is None:
        return
    if not isinstance(scheduler, str):
        raise TypeError(f"scheduler: expected an address (str) or a Client, got {type(scheduler).__name__}")
    try:
        scheme, location = parse_address(scheduler)
        backend = get_backend(scheme)
        try:
            _, port = backend.get_address_host_port(location)
        except NotImplementedError:  # a transport without host and port (inproc)
            port = None
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port {port} out of range [1, 65535]")
    except ValueError as e:
        raise ValueError(f"scheduler: expected a scheduler address such as 'tcp://host:8786', got {scheduler!r} "
                         f"({e})") from None


#: Seconds a scheduler has to answer: its connection and Dask's handshake (then the Client's own).
CONNECT_TIMEOUT = 20.0
#: Seconds a cluster (a ``scheduler`` address's or a given Client's) has to have a worker before
#: the run starts: a cluster with none would hold the job, and the output's lock, forever.
WORKER_TIMEOUT = 60.0


def _cluster_workers(client) -> dict:
    """The workers of ``client``'s cluster (address -> Dask's info about it), once it has one:
    waits up to ``WORKER_TIMEOUT`` seconds for the first.

    Raises:
        OSError: no worker within ``WORKER_TIMEOUT`` seconds, or the cluster gone (the Client
            closed, the scheduler lost), naming ``scheduler``.
    """
    try:
        client.wait_for_workers(1, timeout=WORKER_TIMEOUT)
        info = client.scheduler_info().get("workers")
    except TimeoutError:
        raise OSError(f"scheduler: no worker joined the Dask cluster within {WORKER_TIMEOUT:g} s; nothing was "
                      f"written") from None
    except OSError as e:  # the Client closed meanwhile, the scheduler gone (Dask's RPCClosed, CommClosedError)
        raise OSError(f"scheduler: lost the Dask cluster ({type(e).__name__}: {e}); nothing was written") from None
    if not info:  # an empty answer: the Client closed meanwhile
        raise OSError(f"scheduler: lost the Dask cluster (the Client is {client.status}); nothing was written")
    return info


def _tcp_probe(address: str, timeout: float) -> None:
    """Opens and closes a plain TCP connection to a ``tcp://`` (the default scheme) or ``ws://``
    address: a refused connection (nothing listens on the port) is reported at once, where Dask's
    ``connect`` retries it until its timeout. Other transports are left to Dask (``tls://`` and
    ``wss://`` need security settings, checked first; ``inproc://`` and ``ucx://`` are not TCP).

    Raises:
        ConnectionRefusedError: nothing listens at the address.
        TimeoutError: no TCP connection within ``timeout`` seconds.
        OSError: another failure of the connection (an unknown host, an unreachable network).
    """
    scheme, location = parse_address(address)
    if scheme not in ("tcp", "ws"):
        return
    host, port = get_backend(scheme).get_address_host_port(location)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 host in brackets
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except ConnectionRefusedError:
        raise ConnectionRefusedError(f"connection refused: nothing listens at {where}") from None
    except TimeoutError:
        raise TimeoutError(f"no TCP connection within {timeout:g} s (the host down, or the port "
                           f"filtered?)") from None
    except socket.gaierror as e:
        raise OSError(f"cannot resolve the host {host!r} ({e.strerror})") from None


def _reach(address: str) -> None:
    """Opens one Dask connection to ``address``, the handshake included, asks the server who it is
    (Dask's ``identity``) and closes it, within ``CONNECT_TIMEOUT`` seconds, after a plain TCP
    connection (:func:`_tcp_probe`, within ``CONNECT_TIMEOUT`` too) that reports a refused one at
    once. Dask's ``connect`` bounds the TCP connection but not the handshake that follows, so a
    port that accepts and never answers (not a Dask scheduler) would keep ``Client`` waiting
    forever; here it is an OSError in bounded time. A service that answers with other bytes (which
    Dask reads as a frame length: numpy's MemoryError for exabytes) is an OSError, and a worker's
    or a nanny's address (a TypeError inside ``Client``) a ValueError naming what answered. Run in
    a thread of its own, so that a caller inside an event loop (Jupyter) can call it.

    Raises:
        OSError (TimeoutError included): no answer in time, the connection refused, or an answer
            that is not Dask's (not a Dask server).
        ValueError: a Dask server that is not a scheduler (a worker, a nanny: named, with the
            worker's scheduler); an address Dask refuses.
        TypeError: a transport that needs security settings (``tls://``, ``wss://``).
    """
    import asyncio

    from distributed.comm import connect
    from distributed.core import send_recv

    scheme = parse_address(address)[0]
    _tcp_probe(address, CONNECT_TIMEOUT)

    async def handshake():
        comm = await asyncio.wait_for(connect(address, timeout=CONNECT_TIMEOUT), CONNECT_TIMEOUT)
        try:
            return await asyncio.wait_for(send_recv(comm, op="identity", reply=True, close=True), CONNECT_TIMEOUT)
        finally:
            await comm.close()

    outcome = []

    def run():
        """The handshake on this thread's own event loop; its outcome (the server's identity or the
        exception) in ``outcome``."""
        try:
            outcome.append(asyncio.run(handshake()))
        except BaseException as e:  # handed to the caller's thread
            outcome.append(e)

    thread = threading.Thread(target=run, name="transformer_core-reach-scheduler", daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT + 5)
    if not outcome:
        raise TimeoutError(f"no answer within {CONNECT_TIMEOUT:g} s")
    answer = outcome[0]
    if isinstance(answer, asyncio.TimeoutError):
        raise TimeoutError(f"no answer within {CONNECT_TIMEOUT:g} s (a port that accepts but is not a Dask "
                           "scheduler?)")
    if isinstance(answer, OSError) or (isinstance(answer, TypeError) and scheme in ("tls", "wss")):
        raise answer
    if isinstance(answer, BaseException):  # bytes Dask cannot read (HTTP, SSH): a MemoryError, msgpack's ValueError
        raise OSError(f"it answered, but not as a Dask scheduler: {type(answer).__name__}: {str(answer)[:200]}")
    if not isinstance(answer, dict):
        raise OSError(f"it answered, but not as a Dask scheduler: an identity of type {type(answer).__name__}")
    if "workers" not in answer:  # Scheduler.identity lists its workers; a Worker's or a Nanny's does not
        kind = answer.get("type", "server")
        where = f": its scheduler is {answer['scheduler']!r}" if isinstance(answer.get("scheduler"), str) else ""
        raise ValueError(f"a Dask {kind} answered there, not a scheduler{where}")


def _connect(scheduler, workers, threads_per_worker):
    """(client, cluster or None, whether we own the client, OpenMP threads per worker or None).
    ``scheduler`` and ``workers`` have passed :func:`_check_scheduler`."""
    if isinstance(scheduler, Client):
        return scheduler, None, False, threads_per_worker
    if scheduler is not None:
        try:
            _reach(scheduler)
            client = Client(scheduler, timeout=f"{CONNECT_TIMEOUT}s")
        except (OSError, TimeoutError) as e:
            raise OSError(f"scheduler: cannot connect to {scheduler!r} ({e or 'no answer'})") from None
        except ValueError as e:  # an address Dask refuses only when it connects
            raise ValueError(f"scheduler: expected a scheduler address such as 'tcp://host:8786', got "
                             f"{scheduler!r} ({e})") from None
        except TypeError as e:
            if parse_address(scheduler)[0] in ("tls", "wss"):  # settings an address cannot carry (an SSL context)
                raise ValueError(f"scheduler: cannot use {scheduler!r} ({type(e).__name__}: {e}); a scheduler that "
                                 "needs TLS or other security settings is given as a Client built with them") from None
            raise ValueError(f"scheduler: cannot use {scheduler!r} ({type(e).__name__}: {e}); is it a Dask "
                             f"scheduler's address?") from None
        return client, None, True, threads_per_worker
    cores = _cores()
    n = workers if workers is not None else cores
    threads = threads_per_worker or max(1, cores // n)
    # dashboard_address ":0": the scheduler's HTTP server (which runs even without a dashboard) on a
    # free port; None still tries 8787 and warns on stderr when another cluster holds it
    # Ctrl-C (or the CLI's SIGTERM) while the cluster starts is held until it has started, then
    # closed, and the interrupt raised: cut short, Dask's start leaves half-started workers whose
    # close prints tracebacks (at exit too). A second Ctrl-C interrupts at once.
    before = set(SpecCluster._instances)
    with _signals_held() as held:
        try:
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                                   silence_logs=logging.CRITICAL, env={"OMP_NUM_THREADS": str(threads)})
        except BaseException:  # the second interrupt: the object exists, half started
            for half_built in set(SpecCluster._instances) - before:
                _close_quietly(half_built)
            raise
        try:
            client = Client(cluster)
        except BaseException:
            _close_quietly(cluster)
            raise
    try:
        held.replay()  # the interrupt held (its handler raises KeyboardInterrupt), if one came
    except BaseException:
        client.close()
        cluster.close()
        raise
    return client, cluster, True, threads


class _HeldSignals:
    """The signals :func:`_signals_held` received, with the handlers they were held from."""

    def __init__(self):
        self.handlers: dict = {}  # signal number -> the handler it had before
        self.received: list = []  # (signal number, frame), in order

    def replay(self) -> None:
        """Calls each held signal's own handler (Python's SIGINT handler raises KeyboardInterrupt)."""
        received, self.received = self.received, []
        for signum, frame in received:
            self.handlers[signum](signum, frame)


@contextlib.contextmanager
def _signals_held():
    """Holds SIGINT and SIGTERM, where a Python handler takes them (Ctrl-C; the CLI's SIGTERM),
    for the block's duration: a signal is recorded (``replay()`` later hands it to its handler), a
    second one goes to its handler at once. Only in the main thread (elsewhere nothing is held)."""
    held = _HeldSignals()
    if threading.current_thread() is not threading.main_thread():
        yield held
        return

    def hold(signum, frame):
        """The handler while held (``signal.signal``'s signature)."""
        if held.received:  # asked twice: now
            held.handlers[signum](signum, frame)
        else:
            held.received.append((signum, frame))

    for signum in (signal.SIGINT, signal.SIGTERM):
        if callable(signal.getsignal(signum)):
            held.handlers[signum] = signal.signal(signum, hold)
    try:
        yield held
    finally:
        for signum, handler in held.handlers.items():
            signal.signal(signum, handler)


def _unregister_quietly(client, name: str) -> None:
    """Unregisters the job's worker plugin ``name`` from a cluster that outlives the job (its
    ``teardown`` drops the worker's encoder), so that later workers do not load the model: only
    while the Client runs (a lost scheduler would be waited for), and an error of it is dropped
    (the job's own outcome is what the caller gets)."""
    if client.status != "running":
        return
    try:
        client.unregister_worker_plugin(name)
    except Exception:
        pass


def _close_quietly(cluster) -> None:
    """Closes a local cluster whose start (or its client's) was interrupted, and takes it off Dask's
    list of clusters to close at exit. Its workers may be half started, which Dask's own close
    (the one at exit included) reports with a traceback (``AssertionError: Status.init``): the
    error of such a close is dropped, as the interruption is what the caller reports."""
    try:
        cluster.close(timeout=CONNECT_TIMEOUT)
    except Exception:
        try:
            cluster._loop_runner.stop()  # what a close that got through does last
        except Exception:
            pass
    finally:
        SpecCluster._instances.discard(cluster)


def _nanny_environ_keys() -> set:
    """The variables a local cluster's nannies write into this process's environment before they
    start a worker (Dask's ``distributed.nanny.pre-spawn-environ``, and ``PYTHONHASHSEED`` and
    ``__DASK_PARENT_PID``, which they add)."""
    keys = set(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    return keys | {"PYTHONHASHSEED", "__DASK_PARENT_PID"}


def _check_counts(workers, threads_per_worker, max_in_flight) -> tuple:
    """The counts of :func:`embed_corpus` as Python ints (or None), each checked against its range:
    ``workers`` in ``[1, MAX_WORKERS]``, ``threads_per_worker`` in ``[1, 1024]`` (the core's most
    threads, ``transformer_core.set_num_threads``'s bound, checked here rather than in every worker
    once the cluster has started), ``max_in_flight`` in ``[1, 2**63 - 1]``.

    Raises:
        TypeError: not an int (a bool included). ValueError: out of its range (the range named).
    """
    return tuple(None if value is None else check_int(value, name, 1, maximum)
                 for name, value, maximum in (("workers", workers, MAX_WORKERS),
                                              ("threads_per_worker", threads_per_worker, core.max_num_threads),
                                              ("max_in_flight", max_in_flight, MAX_SIZE)))


def _check_model_loads(model) -> None:
    """Loads the model once in the client (:meth:`SentenceEncoder.from_pretrained`), as
    :func:`transformer_core.corpus.embed_file` does before it writes anything, so that a model the
    workers could not load either (a truncated ``model.safetensors``, a missing or damaged
    ``tokenizer.json``, a ``config.json`` that does not match the weights) is the same one error
    here, before a cluster starts, not a traceback of every worker. The encoder is dropped: the
    workers load their own.

    Raises:
        FileNotFoundError, ValueError: as :meth:`SentenceEncoder.from_pretrained`.
    """
    from .sentence_encoder import SentenceEncoder

    SentenceEncoder.from_pretrained(model)


def embed_corpus(input, out, *, model=DEFAULT_MODEL, scheduler=None, workers: int | None = None,
                 threads_per_worker: int | None = None, chunk_size: int | None = None, batch_size: int = 32,
                 input_format: str | None = None, text_field: str | None = None, errors: str = "strict",
                 resume: bool = False, overwrite: bool = False, progress: bool = False,
                 max_in_flight: int | None = None,
                 on_chunk: Callable[[int, int], None] | None = None) -> corpus.EmbedResult:
    """Embeds every text of ``input`` into the Parquet dataset ``out`` on a Dask cluster.

    Args:
        input: a path (as :func:`transformer_core.corpus.open_source`) or a ``TextSource``.
        out: ``*.parquet`` (a directory dataset; the layout and manifest of
            :func:`transformer_core.corpus.embed_file`).
        model: model directory or embedded name; the workers load it by this name (a directory
            or file found here by its absolute path).
        scheduler: None (start a local cluster of ``workers`` processes), a scheduler address
            (``"tcp://host:8786"``), or a running ``distributed.Client`` (used as is, not
            closed). The job waits up to ``WORKER_TIMEOUT`` (60) seconds for the cluster's first
            worker. Its worker plugin is unregistered from a cluster that outlives the job (the
            workers' encoder dropped); the thread counts set in its worker processes stay.
            While a job on a ``scheduler`` address or its own local cluster runs, the
            ``distributed`` loggers of this process are at CRITICAL and Dask's "Sending large
            graph" warning is off (restored at the end): the job reports a lost cluster itself,
            and survives a worker that dies. Its own local cluster's nannies write Dask's
            pre-spawn variables (``distributed.nanny.pre-spawn-environ``, ``PYTHONHASHSEED``,
            ``__DASK_PARENT_PID``) into this process's environment: those are restored at the
            end, and the caller's other changes meanwhile stay.
        workers: worker processes of the local cluster, at most ``MAX_WORKERS`` (1024) (default:
            one per core).
        threads_per_worker: C++ (OpenMP) threads per worker, at most 1024 (the core's most,
            ``transformer_core.set_num_threads``'s bound) (default: the host's cores / its
            workers); not set in a worker that runs in this process (an in-process cluster),
            whose count is the caller's.
        chunk_size, batch_size, input_format, text_field, errors, resume, overwrite, progress: as
            :func:`transformer_core.corpus.embed_file`.
        max_in_flight: chunks submitted and not finished at once (default 2 per worker + 2): with
            the chunk size, it bounds the client's memory (the texts of the chunks in flight),
            whatever the size of the corpus. The connections this function makes (to a
            ``scheduler`` address, or to its own local cluster, whose scheduler runs in this
            process) run with ``distributed.admin.low-level-log-length`` at
            :data:`DASK_LOG_LENGTH` (0) while the job runs, so that Dask keeps no copies of the
            chunks sent. A ``Client`` given as ``scheduler`` keeps the log length it was built
            with (Dask's default 1000: a copy of up to 1000 chunks, each under 1 MB, per
            connection, in the client's process, and in the scheduler's, this process for a
            ``LocalCluster`` made here): build it, and its cluster, inside
            ``dask.config.set({"distributed.admin.low-level-log-length": 0})`` to bound the
            memory by ``max_in_flight``.
        on_chunk: None, or a callable called in the client after each chunk is recorded, with
            (chunk index, chunks done).

    Returns:
        :class:`transformer_core.corpus.EmbedResult`.

    Raises:
        Every argument is checked before anything is written or removed (and before a cluster
        starts). As :func:`transformer_core.corpus.embed_file` (TypeError / ValueError: a bad
        ``batch_size``, ``resume``, ``overwrite``, ``progress``; ``out`` that is the input; a
        resumed output made with ``quantize``, which only ``embed_file`` continues);
        TypeError / ValueError: ``workers`` not an int in ``[1, 1024]`` (``MAX_WORKERS``),
        ``threads_per_worker`` not an int in ``[1, 1024]``, ``max_in_flight`` or ``chunk_size``
        not an int in ``[1, 2**63 - 1]``; ``model`` not a str or path,
        or an empty one (named ``model``); TypeError: ``scheduler`` neither an address nor a
        ``Client``, ``on_chunk`` neither None nor callable; ValueError: ``out`` not
        ``.parquet``, both ``scheduler`` and ``workers``, a malformed ``scheduler`` address (no
        port, an unknown scheme); FileNotFoundError: no such ``model``. The model is then loaded
        once in this process, as ``embed_file`` does: a model that cannot be loaded (a truncated
        ``model.safetensors``, a missing ``tokenizer.json``, a ``config.json`` that does not
        match the weights) is ``SentenceEncoder.from_pretrained``'s FileNotFoundError or
        ValueError, before a cluster starts. These hold for a complete output with ``resume``
        too (which returns without starting a cluster).
        ValueError: a ``scheduler`` Client that is closed (or whose LocalCluster is), up front.
        OSError: the scheduler cannot be reached or does not answer within ``CONNECT_TIMEOUT``
        (20) seconds, or answers but not as a Dask server; the cluster has no worker within
        ``WORKER_TIMEOUT`` (60) seconds, or is lost before the run starts (nothing written);
        a chunk's workers kept dying (Dask's ``allowed-failures``); ValueError: a ``scheduler``
        address that needs security settings (``tls://``: pass a ``Client`` built with them),
        or that is a Dask worker's or nanny's, not a scheduler's; FileNotFoundError / ValueError
        / OSError naming ``model`` and the worker: a worker cannot load ``model`` or finds
        another model by that name (the workers must see the client's); KeyboardInterrupt with
        what is saved (once the run has started; before, while the cluster is set up and the
        workers load the model, one saying that nothing was written;
        Ctrl-C or the CLI's SIGTERM while a local cluster starts takes effect once it has started,
        and it is closed: a start cut short leaves half-started workers behind; a second one
        interrupts at once).
    """
    t0 = time.perf_counter()
    if corpus._output_kind(out) != "parquet":
        raise ValueError(f"out: the distributed job writes a Parquet dataset, expected a path ending in "
                         f".parquet, got {str(out)!r}")
    workers, threads_per_worker, max_in_flight = _check_counts(workers, threads_per_worker, max_in_flight)
    if on_chunk is not None and not callable(on_chunk):
        raise TypeError(f"on_chunk: expected a callable or None, got {type(on_chunk).__name__}")
    _check_scheduler(scheduler, workers)
    corpus._check_run_arguments(batch_size, resume, overwrite, progress)
    source = corpus._as_source(input, input_format, text_field, errors)
    identity = corpus._model_identity(model)
    worker_model = _worker_model(model)
    job = corpus.EmbedJob.prepare(source, out, identity, chunk_size=chunk_size, resume=resume, overwrite=overwrite,
                                  batch_size=batch_size, float32_only=True)
    _check_model_loads(model)
    if job.complete:
        return corpus._result(job, 0, 0, time.perf_counter() - t0)
    corpus._need_pyarrow("Parquet output")
    # A local cluster's nannies write Dask's pre-spawn variables (OMP_NUM_THREADS=1, PYTHONHASHSEED,
    # ...) into this process's environment at every worker (re)start: those variables, and only
    # those, are restored when the job ends (the caller's other changes meanwhile stay)
    saved_environ = {key: os.environ.get(key) for key in _nanny_environ_keys()} if scheduler is None else {}
    client = cluster = None
    own = False
    settings = contextlib.ExitStack()  # Dask's settings for the connections made here, restored at the end
    if not isinstance(scheduler, Client):
        # read where each connection is built (BatchedSend's log), also a worker's that replaces a
        # dead one, and by a local cluster's nannies for their workers: held until the job ends
        settings.enter_context(_job_dask_settings())
    futures: set = set()
    bar = None
    plugin_name = None  # the worker plugin registered (or tried) on the cluster
    starting = started = False  # whether job.start() was entered, and whether it created (or took over) the output
    try:
        # inside the try: an interruption while the local cluster starts is the same one line
        client, cluster, own, threads = _connect(scheduler, workers, threads_per_worker)
        info = _cluster_workers(client)
        per_host = Counter(get_address_host(addr) for addr in info)
        fingerprint = identity["fingerprint"]
        plugin = EncoderPlugin(worker_model, fingerprint, threads, per_host)
        plugin_name = f"transformer_core-encoder-{fingerprint[:12]}-{uuid.uuid4().hex[:8]}"
        client.register_plugin(plugin, name=plugin_name)
        starting = True
        job.start()
        started = True
        directory = str(job.data_path.resolve())
        width = job.manifest["part_width"]
        normalize = job.manifest.get("normalize", True)
        limit = max_in_flight or 2 * max(1, len(info)) + 2
        run = job.run
        pending = job.pending()
        done_queue = as_completed()

        def submit_next() -> bool:
            """Submits the next pending chunk to the cluster; False when none is left."""
            item = next(pending, None)
            if item is None:
                return False
            index, start, texts = item
            fut = client.submit(_embed_chunk, worker_model, fingerprint, directory, run, index, width, start, texts,
                                batch_size, normalize, key=f"transformer_core-embed-{run}-{index}", retries=1)
            futures.add(fut)
            done_queue.add(fut)
            return True

        while len(futures) < limit and submit_next():
            pass
        bar = corpus._progress_bar(progress, job.num_rows, job.rows_done(), "embed")
        rows_computed = chunks_computed = 0
        for fut in done_queue:
            try:
                index, rows = fut.result()
            except KilledWorker as e:
                raise OSError(f"the workers running a chunk died repeatedly ({e}); the chunks done are saved, "
                              f"--resume continues") from None
            except (FutureCancelledError, CommClosedError) as e:  # the scheduler went away mid-run
                raise OSError(f"lost the Dask cluster ({type(e).__name__}: {e}); the chunks done are saved, "
                              f"--resume continues") from None
            futures.discard(fut)
            job.commit(index)
            rows_computed += rows
            chunks_computed += 1
            bar.update(rows)
            if on_chunk is not None:
                on_chunk(index, job.num_completed)
            submit_next()
        job.finish()
        return corpus._result(job, chunks_computed, rows_computed, time.perf_counter() - t0)
    except KeyboardInterrupt:
        if started:
            raise KeyboardInterrupt(job.interrupted_message()) from None
        if starting:  # inside job.start(): removing an output that overwrite replaces, or making the new one
            raise KeyboardInterrupt(f"interrupted while the output was being prepared: {job.out} may be partly "
                                    f"removed or made (nothing was embedded); the same command with --overwrite "
                                    f"starts over") from None
        # before the run started (connecting, the workers loading the model): nothing of it exists
        # to resume, and an output that ``overwrite`` was to replace is still the old one
        raise KeyboardInterrupt(f"interrupted before the run started (while the cluster and its workers were "
                                f"set up): nothing was written to {job.out}") from None
    finally:
        try:
            if futures:
                client.cancel(list(futures))
            if bar is not None:
                bar.close()
            if plugin_name is not None and cluster is None:  # a cluster that outlives the job: left as it was
                _unregister_quietly(client, plugin_name)
            if own and client is not None:
                client.close()
            if cluster is not None:
                cluster.close()
        finally:
            settings.close()
            job.close()  # the output's lock, when the run did not finish (finish released it)
            for key, value in saved_environ.items():
                if value is None:
                    os.environ.pop(key, None)
                elif os.environ.get(key) != value:
                    os.environ[key] = value
