"""horovodrun's `--config-file`: Horovod's own YAML schema, applied under the command line.

    controller: mpi | gloo
    params:          fusion_threshold_mb, cycle_time_ms, cache_capacity, hierarchical_allreduce, hierarchical_allgather
    autotune:        enabled, log_file, warmup_samples, steps_per_sample, bayes_opt_max_samples, gaussian_process_noise
    timeline:        filename, mark_cycles
    stall_check:     enabled, warning_time_seconds, shutdown_time_seconds
    library_options: mpi_threads_disable, num_nccl_streams, thread_affinity, gloo_timeout_seconds
    logging:         level, with_timestamp

A value fills its option only where the command line did not give it (horovodrun's rule). Values are
checked by type (a wrong one is a UsageError naming the key); a key outside the schema is ignored, as
horovodrun does, but named in a note so a typo is not silent.
"""
from __future__ import annotations

from trainrun.errors import UsageError

# section -> key -> (option dest, type); stall_check.enabled is the inverse of --no-stall-check
SCHEMA: dict[str, dict[str, tuple[str, type]]] = {
    "params": {"fusion_threshold_mb": ("fusion_threshold_mb", int), "cycle_time_ms": ("cycle_time_ms", float),
               "cache_capacity": ("cache_capacity", int), "hierarchical_allreduce": ("hierarchical_allreduce", bool),
               "hierarchical_allgather": ("hierarchical_allgather", bool)},
    "autotune": {"enabled": ("autotune", bool), "log_file": ("autotune_log_file", str),
                 "warmup_samples": ("autotune_warmup_samples", int), "steps_per_sample": ("autotune_steps_per_sample", int),
                 "bayes_opt_max_samples": ("autotune_bayes_opt_max_samples", int),
                 "gaussian_process_noise": ("autotune_gaussian_process_noise", float)},
    "timeline": {"filename": ("timeline_filename", str), "mark_cycles": ("timeline_mark_cycles", bool)},
    "stall_check": {"enabled": ("no_stall_check", bool), "warning_time_seconds": ("stall_check_warning_time_seconds", int),
                    "shutdown_time_seconds": ("stall_check_shutdown_time_seconds", int)},
    "library_options": {"mpi_threads_disable": ("mpi_threads_disable", bool), "num_nccl_streams": ("num_nccl_streams", int),
                        "thread_affinity": ("thread_affinity", int), "gloo_timeout_seconds": ("gloo_timeout_seconds", int)},
    "logging": {"level": ("log_level", str), "with_timestamp": ("log_with_timestamp", bool)},
}


def _typed(path: str, where: str, value, kind: type):
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"--config-file {path}: {where}: expected true or false, got {value!r}")
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    want = {int: "a whole number", float: "a number", str: "a string"}[kind]
    raise UsageError(f"--config-file {path}: {where}: expected {want}, got {value!r}")


def load(path: str) -> dict:
    """The parsed YAML document (a mapping); UsageError if it cannot be read or is not one. Read as trainrun's
    --config is (config.read_yaml_config: size, values and alias expansion bounded, UTF-8 only)."""
    from trainrun.config import read_yaml_config

    doc = read_yaml_config(path, "--config-file")
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise UsageError(f"--config-file {path}: expected Horovod's mapping (params:, timeline:, ...), got {type(doc).__name__}")
    return doc


def apply(ns, doc: dict, path: str) -> list[str]:
    """Fill the options of `ns` the command line left unset from `doc`; returns the notes (ignored keys)."""
    notes = []
    for section, body in doc.items():
        if section == "controller":
            choice = str(body).lower()
            if choice not in ("mpi", "gloo"):
                raise UsageError(f"--config-file {path}: controller: '{body}' is not mpi or gloo")
            if not (ns.use_gloo or ns.use_mpi or ns.use_jsrun):
                ns.use_gloo, ns.use_mpi = choice == "gloo", choice == "mpi"
            continue
        keys = SCHEMA.get(section)
        if keys is None:
            notes.append(f"--config-file {path}: '{section}' is not a section of Horovod's schema; ignored")
            continue
        if not isinstance(body, dict):
            raise UsageError(f"--config-file {path}: {section}: expected a mapping of key: value")
        for key, value in body.items():
            if key not in keys:
                notes.append(f"--config-file {path}: '{section}.{key}' is not a key of Horovod's schema; ignored")
                continue
            dest, kind = keys[key]
            if value is None:
                continue
            value = _typed(path, f"{section}.{key}", value, kind)
            if section == "stall_check" and key == "enabled":
                value = not value
            if section == "logging" and key == "level":
                value = value.upper()
            if getattr(ns, dest) is None:
                setattr(ns, dest, value)
    return notes
