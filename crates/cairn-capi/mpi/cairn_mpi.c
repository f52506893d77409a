/* The MPI side of cairn_open_mpi: libcairn itself links no MPI (its header needs none, and one
 * library serves programs built with Open MPI or MPICH), so this file is compiled once per MPI
 * (scripts/build_mpi.sh: libcairn_mpi_openmpi.so, libcairn_mpi_mpich.so, installed beside
 * libcairn.so) and libcairn loads the one matching the MPI already in the process. It carries
 * the bytes of the collective file writer's protocol (crates/cairn-capi/src/mpi.rs); every call
 * returns an MPI error code, 0 for success, on a duplicate of the caller's communicator whose
 * errors return instead of aborting. */
#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tag of Cairn's messages (as Python's cairn._mpi), on the duplicate: never the program's. */
#define TAG 7411

struct cairn_mpi {
    MPI_Comm comm;
    MPI_Win win;
    int64_t *counter;
};

/* Duplicates the communicator whose Fortran handle is `fcomm`; the rank and size in it. */
int cairn_mpi_attach(int64_t fcomm, struct cairn_mpi **out, int *rank, int *size) {
    int init = 0, rc;
    MPI_Initialized(&init);
    if (!init) return MPI_ERR_OTHER;
    struct cairn_mpi *h = calloc(1, sizeof *h);
    if (!h) return MPI_ERR_NO_MEM;
    h->win = MPI_WIN_NULL;
    rc = MPI_Comm_dup(MPI_Comm_f2c((MPI_Fint)fcomm), &h->comm);
    if (rc == MPI_SUCCESS) MPI_Comm_set_errhandler(h->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(h->comm, rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(h->comm, size);
    if (rc != MPI_SUCCESS) {
        free(h);
        return rc;
    }
    *out = h;
    return MPI_SUCCESS;
}

/* Each rank's node (the lowest rank sharing memory with it) into `nodes` (size entries), and
 * whether this node runs more ranks than this rank may use cores. */
int cairn_mpi_nodes(struct cairn_mpi *h, uint32_t *nodes, int *oversubscribed) {
    MPI_Comm local;
    int me, leader, n, rc = MPI_Comm_split_type(h->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
    if (rc != MPI_SUCCESS) return rc;
    MPI_Comm_rank(h->comm, &me);
    rc = MPI_Allreduce(&me, &leader, 1, MPI_INT, MPI_MIN, local);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(local, &n);
    MPI_Comm_free(&local);
    if (rc != MPI_SUCCESS) return rc;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    *oversubscribed = cores > 0 && n > cores;
    uint32_t mine = (uint32_t)leader;
    return MPI_Allgather(&mine, 1, MPI_UINT32_T, nodes, 1, MPI_UINT32_T, h->comm);
}

/* Rank 0's `*len` bytes of `buf` (at most `cap`) to every rank. */
int cairn_mpi_bcast(struct cairn_mpi *h, char *buf, int64_t *len, int64_t cap) {
    int rc = MPI_Bcast(len, 1, MPI_INT64_T, 0, h->comm);
    if (rc != MPI_SUCCESS) return rc;
    if (*len < 0 || *len > cap) return MPI_ERR_TRUNCATE;
    return MPI_Bcast(buf, (int)*len, MPI_BYTE, 0, h->comm);
}

/* Whether every rank passed `ok` (`*all`). */
int cairn_mpi_all(struct cairn_mpi *h, int ok, int *all) {
    return MPI_Allreduce(&ok, all, 1, MPI_INT, MPI_LAND, h->comm);
}

/* The offset counters members reserve room with (one-sided fetch-and-add, collective). */
int cairn_mpi_window(struct cairn_mpi *h) {
    if (h->win != MPI_WIN_NULL) return MPI_SUCCESS;
    return MPI_Win_allocate(8, 8, MPI_INFO_NULL, h->comm, &h->counter, &h->win);
}

int cairn_mpi_send(struct cairn_mpi *h, uint32_t dest, const void *data, int len) {
    return MPI_Send(data, len, MPI_BYTE, (int)dest, TAG, h->comm);
}

/* The length of the next message from `src`, waiting for it; polls with short sleeps when
 * `poll` (more ranks than cores: a busy-waiting receive takes the core the sender needs). */
int cairn_mpi_probe(struct cairn_mpi *h, uint32_t src, int poll, int *len) {
    MPI_Status st;
    int rc;
    if (poll) {
        int flag = 0;
        useconds_t delay = 10;
        while ((rc = MPI_Iprobe((int)src, TAG, h->comm, &flag, &st)) == MPI_SUCCESS && !flag) {
            usleep(delay);
            delay = delay < 1000 ? 2 * delay : 1000;
        }
    } else {
        rc = MPI_Probe((int)src, TAG, h->comm, &st);
    }
    return rc == MPI_SUCCESS ? MPI_Get_count(&st, MPI_BYTE, len) : rc;
}

int cairn_mpi_recv(struct cairn_mpi *h, uint32_t src, void *buf, int len) {
    return MPI_Recv(buf, len, MPI_BYTE, (int)src, TAG, h->comm, MPI_STATUS_IGNORE);
}

/* Sets this rank's counter to `at`; collective, so no rank reserves before it is set. */
int cairn_mpi_start(struct cairn_mpi *h, uint64_t at, int ok, int *all) {
    int me, rc = cairn_mpi_window(h);
    if (rc != MPI_SUCCESS) return rc;
    MPI_Comm_rank(h->comm, &me);
    int64_t v = (int64_t)at;
    rc = MPI_Win_lock(MPI_LOCK_EXCLUSIVE, me, 0, h->win);
    if (rc == MPI_SUCCESS) rc = MPI_Put(&v, 1, MPI_INT64_T, me, 0, 1, MPI_INT64_T, h->win);
    if (rc == MPI_SUCCESS) rc = MPI_Win_unlock(me, h->win);
    return rc == MPI_SUCCESS ? cairn_mpi_all(h, ok, all) : rc;
}

/* Adds `len` to rank `owner`'s counter; its value before, in `*before`. */
int cairn_mpi_reserve(struct cairn_mpi *h, uint32_t owner, uint64_t len, uint64_t *before) {
    int64_t add = (int64_t)len, old = 0;
    int rc = MPI_Win_lock(MPI_LOCK_SHARED, (int)owner, 0, h->win);
    if (rc == MPI_SUCCESS) rc = MPI_Fetch_and_op(&add, &old, MPI_INT64_T, (int)owner, 0, MPI_SUM, h->win);
    if (rc == MPI_SUCCESS) rc = MPI_Win_unlock((int)owner, h->win);
    *before = (uint64_t)old;
    return rc;
}

int cairn_mpi_barrier(struct cairn_mpi *h) {
    return MPI_Barrier(h->comm);
}

/* MPI's text for error code `rc` into `buf` (`cap` >= MPI_MAX_ERROR_STRING is enough). */
void cairn_mpi_error(int rc, char *buf, int cap) {
    char text[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(rc, text, &n) != MPI_SUCCESS) n = 0;
    if (n >= cap) n = cap - 1;
    memcpy(buf, text, (size_t)n);
    buf[n] = 0;
}

/* Frees the window and the duplicate (collective, as MPI_Comm_free is). */
void cairn_mpi_free(struct cairn_mpi *h) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) {
        if (h->win != MPI_WIN_NULL) MPI_Win_free(&h->win);
        MPI_Comm_free(&h->comm);
    }
    free(h);
}
