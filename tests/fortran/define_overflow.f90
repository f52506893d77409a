! Shapes past 64 bits through the Fortran module (issue 52, item 5): cairn_define refuses a shape
! whose element count (2**62 x 2**62) or byte size (2**62 f8 elements) overflows, with the C
! API's invalid-argument status and a message naming the shape; a sane one is then defined.
! Run: ./define_overflow cairn.toml   (prints one line per define, then "fortran define: ok")
program define_overflow
  use cairn
  implicit none
  type(cairn_file) :: f
  character(len=256) :: config
  character(len=512) :: msg
  integer :: ierr

  call get_command_argument(1, config)
  call cairn_open(f, "overflow", "w", ierr, config=trim(config))
  if (ierr /= 0) stop 2
  call cairn_define(f, "elements", "f8", [2_8**62, 2_8**62], ierr)
  call report("elements")
  call cairn_define(f, "bytes", "f8", [2_8**62], ierr)
  call report("bytes")
  call cairn_define(f, "sane", "f8", [4_8, 3_8], ierr)
  if (ierr /= 0) stop 3
  call cairn_close(f, ierr)
  print '(a)', "fortran define: ok"
contains
  subroutine report(what)
    character(*), intent(in) :: what
    call cairn_error_message(msg)
    print '(a, a, i0, a, a)', what, ": ierr ", ierr, ": ", trim(msg)
  end subroutine report
end program define_overflow
