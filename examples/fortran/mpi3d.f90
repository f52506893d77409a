! Writes a 3-D real(8) field T(nx, ny, nz) from every MPI rank with comm= (each rank a slab along
! z), then reads back what Python wrote. With the file engine the ranks of a node share one data
! file and commit each step together (N→M aggregation, as Python's comm=).
! Build: mpifort mpi3d.f90 $(pkg-config --cflags --libs cairn-fortran)
! Run:   mpirun -n 4 ./mpi3d cairn.toml [python-dataset]
! Value at 0-based global (i, j, k) of step s: s * 1e6 + i + 100 * j + 10000 * k; Python sees T
! with shape (nz, ny, nx) and dims ("z", "y", "x"). The Python dataset holds P of shape (5, 4, 3)
! (Python order) with P[z, y, x] = 1000 z + 10 y + x, and N (int64, shape (4,)) = 7 * index.
program mpi3d
  use mpi
  use cairn
  implicit none
  integer, parameter :: nx = 5, ny = 4, nzl = 3
  type(cairn_file) :: f
  real(8), allocatable :: t(:, :, :)
  real(8) :: p(3, 4, 5)
  integer(8) :: n(4)
  character(len=256) :: config, pyname, msg
  integer :: ierr, rank, nranks, i, j, k
  integer(8) :: s, z0

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  call get_command_argument(1, config)
  call get_command_argument(2, pyname)
  allocate(t(nx, ny, nzl))
  z0 = int(rank, 8) * nzl

  call cairn_open(f, "mpi3d", "w", ierr, config=trim(config), comm=MPI_COMM_WORLD)
  call check("open")
  call cairn_define(f, "T", "f8", [int(nx, 8), int(ny, 8), int(nzl * nranks, 8)], ierr, dims=["x", "y", "z"])
  call check("define")
  do s = 0, 1
    do k = 1, nzl
      do j = 1, ny
        do i = 1, nx
          t(i, j, k) = s * 1d6 + (i - 1) + 100 * (j - 1) + 10000 * (z0 + k - 1)
        end do
      end do
    end do
    call cairn_begin_step(f, s, ierr)
    call check("begin_step")
    call cairn_put(f, "T", t, [0_8, 0_8, z0], ierr)
    call check("put")
    call cairn_end_step(f, ierr)  ! collective with the file engine: returns once committed
    call check("end_step")
  end do
  call cairn_close(f, ierr)  ! waits for every rank
  call check("close")

  if (len_trim(pyname) > 0) then
    call cairn_open(f, trim(pyname), "r", ierr, config=trim(config))
    call check("open the Python dataset")
    call cairn_get(f, "P", 0_8, [0_8, 0_8, 0_8], p, ierr)
    call check("get P")
    do k = 1, 5
      do j = 1, 4
        do i = 1, 3
          if (p(i, j, k) /= 1000 * (k - 1) + 10 * (j - 1) + (i - 1)) stop "P read back wrong"
        end do
      end do
    end do
    call cairn_get(f, "N", 0_8, [0_8], n, ierr)
    call check("get N")
    if (any(n /= [0_8, 7_8, 14_8, 21_8])) stop "N read back wrong"
    call cairn_close(f, ierr)
  end if
  if (rank == 0) print '(a, i0, a)', "Fortran MPI: ", nranks, " ranks wrote T with comm=, read Python's P and N"
  call MPI_Finalize(ierr)

contains
  subroutine check(what)
    character(*), intent(in) :: what
    if (ierr /= 0) then
      call cairn_error_message(msg)
      print '(a, i0, a, a, a, i0, a, a)', "rank ", rank, ": cairn_", what, " failed (", ierr, "): ", trim(msg)
      call MPI_Abort(MPI_COMM_WORLD, 1, ierr)
    end if
  end subroutine check
end program mpi3d
