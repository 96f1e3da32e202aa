"""mpi_case.py — what the multi-rank Python tests share: skip (exit 77) without NumPy or
mpi4py, the binding on the path, the world communicator, a context of the backend named on
the command line (skip without it), one random seed for every rank, and the verdict."""
import os
import sys

try:
    import numpy as np
    from mpi4py import MPI
except ImportError as e:
    print(f"{os.path.basename(sys.argv[0])}: {e}, skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import attnrun  # noqa: E402

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()


def start(name):
    """(context, rng): the same random stream on every rank; exits 77 without the backend."""
    backend = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    try:
        ctx = attnrun.Context(backend)
    except attnrun.AttnError as e:
        print(f"{name}: no {backend} context ({e}), skipped")
        sys.exit(77)
    # a fresh seed each run (ATTN_TEST_SEED repeats one), printed so a failure can be rerun
    env_seed = os.environ.get("ATTN_TEST_SEED")
    seed = int(env_seed) if env_seed else int.from_bytes(os.urandom(4), "little")
    seed = COMM.bcast(seed if RANK == 0 else None)
    if RANK == 0:
        print(f"{name}: seed {seed} (ATTN_TEST_SEED={seed} repeats it)", flush=True)
    return ctx, np.random.default_rng(seed)


def verdict(name, ctx, bad):
    """Exit status of the whole job: 0 when no rank had a failure."""
    ctx.close()
    fails = COMM.allreduce(len(bad))
    if RANK == 0:
        print(f"{name}: {SIZE} ranks, {'all passed' if not fails else f'{fails} failed'}")
    return 1 if fails else 0
