! Writes a 3-D field T(nx, ny, nz) for 2 steps through the Fortran module, then reads a box back.
! Build: gfortran -I<include> write3d.f90 $(pkg-config --cflags --libs cairn-fortran)
! Run:   ./write3d [cairn.toml]   (Python sees T with shape (nz, ny, nx) and dims ("z", "y", "x"))
! Value at 0-based (i, j, k) of step s: s * 1e6 + i + 100 * j + 10000 * k.
program write3d
  use cairn
  implicit none
  integer, parameter :: nx = 6, ny = 4, nz = 3
  type(cairn_file) :: f
  real(8) :: t(nx, ny, nz), box(2, 2, 1)
  character(len=256) :: config, msg
  integer :: ierr, i, j, k
  integer(8) :: s

  call get_command_argument(1, config)
  call cairn_open(f, "fortran3d", "w", ierr, config=trim(config))
  call check("open")
  call cairn_define(f, "T", "f8", [int(nx, 8), int(ny, 8), int(nz, 8)], ierr, dims=["x", "y", "z"])
  call check("define")
  do s = 0, 1
    do k = 1, nz
      do j = 1, ny
        do i = 1, nx
          t(i, j, k) = s * 1d6 + (i - 1) + 100 * (j - 1) + 10000 * (k - 1)
        end do
      end do
    end do
    call cairn_begin_step(f, s, ierr)
    call check("begin_step")
    call cairn_put(f, "T", t, [0_8, 0_8, 0_8], ierr)
    call check("put")
    call cairn_end_step(f, ierr)
    call check("end_step")
  end do
  call cairn_put(f, "T", t, [0_8, 0_8], ierr)  ! outside a step, and one offset short: an error
  if (ierr == 0) stop "a bad put was accepted"
  call cairn_close(f, ierr)
  call check("close")

  call cairn_open(f, "fortran3d", "r", ierr, config=trim(config))
  call check("open for reading")
  call cairn_get(f, "T", 1_8, [2_8, 1_8, 2_8], box, ierr)  ! i = 2..3, j = 1..2, k = 2
  call check("get")
  if (box(2, 1, 1) /= 1d6 + 3 + 100 * 1 + 10000 * 2) stop "read back a wrong value"
  call cairn_close(f, ierr)
  print '(a)', "Fortran: wrote 2 steps of T(6, 4, 3), read a box back"

contains
  subroutine check(what)
    character(*), intent(in) :: what
    if (ierr /= 0) then
      call cairn_error_message(msg)
      print '(a, a, a, i0, a, a)', "cairn_", what, " failed (", ierr, "): ", trim(msg)
      stop 1
    end if
  end subroutine check
end program write3d
