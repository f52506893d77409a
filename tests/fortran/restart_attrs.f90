! Fortran settings, attributes and restart (issue 56): the configuration is TOML text built with
! new_line('a'); cairn_define takes attrs (JSON) and cairn_set_attr sets text, real(8),
! integer(4) and integer(8) values on a variable and on the dataset (var ""); a restart opens
! "a", reads its state at cairn_next_step - 1 through the same handle and goes on;
! cairn_halt_requested and cairn_halt_requested_all are asked once per run, and cairn_wait_drained
! says the newest step is on disk.
! Run: ./restart_attrs DIR   (prints "fortran restart: resumed at 2, halt T|F")
program restart_attrs
  use cairn
  implicit none
  type(cairn_file) :: f
  character(len=512) :: dir, msg
  character(len=:), allocatable :: config
  real(8) :: t(6), back(6)
  integer(8) :: s, next
  integer :: ierr, i
  logical :: halt, drained

  call get_command_argument(1, dir)
  config = 'engine = "file"' // new_line('a') // '[file]' // new_line('a') // 'path = "' // trim(dir) // '"'
  call cairn_open(f, "ftemp", "w", ierr, config=config)
  call check("open w")
  call cairn_define(f, "T", "f8", [6_8], ierr, dims=["x"], attrs='{"units": "K"}')
  call check("define")
  call cairn_set_attr(f, "T", "long_name", 'air "temperature"', ierr)
  call check("set_attr text")
  call cairn_set_attr(f, "T", "valid_max", 350.5d0, ierr)
  call check("set_attr real")
  call cairn_set_attr(f, "", "title", "Fortran run", ierr)
  call check("set_attr dataset")
  call cairn_set_attr(f, "", "version", 3, ierr)
  call check("set_attr int4")
  call cairn_set_attr(f, "", "seed", 12345678901_8, ierr)
  call check("set_attr int8")
  call cairn_set_attr(f, "nope", "units", "m", ierr)
  if (ierr == 0) stop 4
  do s = 0, 1
    t = [(273.0d0 + i + 10 * s, i = 1, 6)]
    call cairn_begin_step(f, s, ierr)
    call cairn_put(f, "T", t, [0_8], ierr)
    call check("put")
    call cairn_end_step(f, ierr)
    call check("end")
  end do
  call cairn_close(f, ierr)

  call cairn_open(f, "ftemp", "a", ierr, config=config)
  call check("open a")
  call cairn_next_step(f, next, ierr)
  call check("next_step")
  call cairn_get(f, "T", next - 1, [0_8], back, ierr)
  call check("get on the append handle")
  if (any(back /= [(283.0d0 + i, i = 1, 6)])) stop 5
  call cairn_begin_step(f, next, ierr)
  call cairn_put(f, "T", back + 1, [0_8], ierr)
  call cairn_end_step(f, ierr)
  call check("end after restart")
  call cairn_halt_requested_all(f, halt, ierr)
  call check("halt agreed")
  if (halt .neqv. cairn_halt_requested()) stop 6
  call cairn_wait_drained(f, -1_8, 5d0, drained, ierr)
  call check("wait drained")
  if (.not. drained) stop 7
  call cairn_close(f, ierr)
  print '(a, i0, a, l1)', "fortran restart: resumed at ", next, ", halt ", cairn_halt_requested()
contains
  subroutine check(what)
    character(*), intent(in) :: what
    if (ierr /= 0) then
      call cairn_error_message(msg)
      print '(a, a, i0, a, a)', what, ": ierr ", ierr, ": ", trim(msg)
      stop 3
    end if
  end subroutine check
end program restart_attrs
