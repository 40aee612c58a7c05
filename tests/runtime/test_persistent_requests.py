"""The runtime's persistent MPI requests over real MPI on 3 ranks: the agreement round's
(runtime/round_port.py) and the backend's small allreduces (runtime/backends/mpi.py). Making one is
collective, so every rank must make and drop them at the same points; each worker checks results
against what every rank sent, and both fall back to nonblocking calls on an MPI before 4.0."""
from tests.runtime.launch import WORKERS, run_ranks


def test_round_port_on_three_ranks():
    """runtime/round_port.py over real MPI on 3 ranks: rounds of sizes 1, 2, 1, 3, 2, 1 words (a
    persistent request per size, made once and restarted), and the same through the nonblocking
    fallback an MPI before 4.0 gets; every rank checks AND and OR of the three contributions."""
    proc = run_ranks(WORKERS / "round_port.py", 3, [], None, 60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("round port ok") == 3, proc.stderr


def test_small_allreduces_on_three_ranks():
    """backends/mpi.py's SmallAllreduces over real MPI on 3 ranks: 60 (size, dtype, op) keys, twice,
    against NumPy (in and out of place); more keys than it keeps, so every rank drops and remakes the
    same requests at the same points (a rank out of step would hang or mismatch); the nonblocking
    fallback too; no MPICH warning about persistent requests left at exit."""
    proc = run_ranks(WORKERS / "small_allreduces.py", 3, [], None, 120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.count("small allreduces ok") == 3, proc.stderr
    assert "persistent request" not in proc.stderr, proc.stderr
