"""`horovod.run`: Horovod 0.28.1's signature (horovod/runner/__init__.py), the arguments turned into a
horovodrun command line and translated by horovodrun's translator, so `horovod.run(..., use_gloo=True)`
and `horovodrun --gloo` mean the same; its notes are printed as `horovod.run: ...`. Then trainrun.run's
launch. `np`, `min_np`, `max_np` are Horovod's deprecated spellings, still taken."""
from __future__ import annotations

import sys


def _horovodrun_argv(num_proc, min_num_proc, max_num_proc, slots, reset_limit, cooldown_range, hosts, hostfile,
                     start_timeout, ssh_port, ssh_identity_file, disable_cache, output_filename, verbose, use_gloo,
                     use_mpi, mpi_args, network_interface) -> list[str]:
    argv = ["-np", str(num_proc)]
    for flag, value in (("--min-np", min_num_proc), ("--max-np", max_num_proc), ("--slots-per-host", slots),
                        ("--reset-limit", reset_limit), ("-H", hosts), ("--hostfile", hostfile),
                        ("--start-timeout", start_timeout), ("-p", ssh_port), ("-i", ssh_identity_file),
                        ("--output-filename", output_filename), ("--mpi-args", mpi_args)):
        if value is not None:
            argv += [flag + "=" + str(value)] if flag == "--mpi-args" else [flag, str(value)]
    if cooldown_range is not None:
        argv += ["--blacklist-cooldown-range", *map(str, cooldown_range)]
    if network_interface:
        argv += ["--network-interfaces", network_interface if isinstance(network_interface, str) else ",".join(network_interface)]
    for flag, on in (("--disable-cache", disable_cache), ("--verbose", verbose), ("--gloo", use_gloo), ("--mpi", use_mpi)):
        if on:
            argv.append(flag)
    return argv


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None, slots=None, reset_limit=None,
        cooldown_range=None, hosts=None, hostfile=None, start_timeout=None, ssh_port=None, ssh_identity_file=None,
        disable_cache=None, output_filename=None, verbose=None, use_gloo=None, use_mpi=None, mpi_args=None,
        network_interface=None, executable=None, np=None, min_np=None, max_np=None):
    """Horovod's `horovod.run`: run `func(*args, **kwargs)` on `num_proc` ranks and return the list of
    their return values (index = rank). See trainrun.run for what runs and what is raised
    (trainrun.RankError carries the failing rank, its host and its traceback)."""
    if np is not None and num_proc == 1:
        num_proc = np
    min_num_proc = min_num_proc if min_num_proc is not None else min_np
    max_num_proc = max_num_proc if max_num_proc is not None else max_np
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    from trainrun.horovodrun.translate import translate
    from trainrun.runfunc.api import check_argv, launch_call

    hargv = _horovodrun_argv(num_proc, min_num_proc, max_num_proc, slots, reset_limit, cooldown_range, hosts, hostfile,
                             start_timeout, ssh_port, ssh_identity_file, disable_cache, output_filename, verbose,
                             use_gloo, use_mpi, mpi_args, network_interface)
    t = translate(hargv + ["python"], {})  # no discovery script here, so never slots to wrap
    for note in t.notes:
        print(f"horovod.run: {note}", file=sys.stderr)
    argv = list(t.argv[:t.argv.index("--")])
    i = argv.index("--prefix")
    del argv[i:i + 2]  # run() sets the rank prefix it reads
    check_argv(argv)
    return launch_call(func, args, kwargs, argv, local=not (hosts or hostfile), executable=executable)
