! The Fortran module `cairn` (Fortran 2008 + TS 29113 assumed rank, over the C API in cairn.h).
!
!   use cairn
!   type(cairn_file) :: f
!   call cairn_open(f, "run1", "w", ierr, config="cairn.toml", comm=MPI_COMM_WORLD)  ! or rank=, nranks=
!   call cairn_define(f, "T", "f8", shape, ierr, dims=["x", "y", "z"], attrs='{"units": "K"}')
!   call cairn_set_attr(f, "T", "long_name", "temperature", ierr)   ! or real(8), integer; var "": the dataset's
!   call cairn_begin_step(f, step, ierr)
!   call cairn_put(f, "T", block, offset, ierr)   ! real(8), real(4), integer(4), integer(8); any rank
!   call cairn_end_step(f, ierr)
!   call cairn_get(f, "T", step, offset, block, ierr)
!   call cairn_close(f, ierr)
!
! A restart opens with "a", reads its state at `cairn_next_step(f, next, ierr)` minus one with
! `cairn_get` on the same handle, and goes on; `cairn_halt_requested()` says when the job wants it
! to stop (its halt file, or the allocation's end). `config` is a cairn.toml's path or TOML text
! (text holding a newline or "="): 'engine = "file"' // new_line('a') // 'path = "out"'.
!
! `ierr` is 0 on success, else the C API's status; `cairn_error_message(msg)` says why. Shapes,
! offsets and dims are in Fortran order, reversed against C and Python (as ADIOS2's Fortran
! bindings do), and offsets are 0-based: an array of shape (nx, ny, nz) written whole reads in
! Python as shape (nz, ny, nx), element for element. A .mod file is compiler-specific: this one is
! built by the system gfortran.
module cairn
  use, intrinsic :: iso_c_binding
  implicit none
  private
  public :: cairn_file, cairn_open, cairn_define, cairn_begin_step, cairn_put, cairn_end_step, cairn_get, &
            cairn_close, cairn_error_message, cairn_set_attr, cairn_next_step, cairn_halt_requested, &
            cairn_halt_requested_all, cairn_wait_drained

  !> An open dataset (a writer or a reader).
  type :: cairn_file
    type(c_ptr) :: ptr = c_null_ptr
  end type cairn_file

  !> Puts a block of a variable (its type's array, any rank) at `offset` (0-based, Fortran order).
  interface cairn_put
    module procedure put_r8, put_r4, put_i4, put_i8
  end interface cairn_put

  !> Sets one attribute of variable `var` (before its first committed step) or, with `var` "",
  !> of the dataset: character, real(8), integer(4) or integer(8) values.
  interface cairn_set_attr
    module procedure set_attr_text, set_attr_r8, set_attr_i4, set_attr_i8
  end interface cairn_set_attr

  !> Reads the box at `offset` whose extents are the block's shape into the block.
  interface cairn_get
    module procedure get_r8, get_r4, get_i4, get_i8
  end interface cairn_get

  interface
    integer(c_int) function c_open(name, mode, config, rank, nranks, out) bind(C, name="cairn_open")
      import :: c_int, c_char, c_ptr
      character(kind=c_char), dimension(*), intent(in) :: name, mode
      type(c_ptr), value :: config
      integer(c_int), value :: rank, nranks
      type(c_ptr), intent(out) :: out
    end function c_open
    integer(c_int) function c_open_mpi(name, mode, config, comm, out) bind(C, name="cairn_open_mpi")
      import :: c_int, c_char, c_ptr, c_int64_t
      character(kind=c_char), dimension(*), intent(in) :: name, mode
      type(c_ptr), value :: config
      integer(c_int64_t), value :: comm
      type(c_ptr), intent(out) :: out
    end function c_open_mpi
    integer(c_int) function c_define_ex(f, name, dtype, ndim, shape, dims, attrs, constant) bind(C, name="cairn_define_ex")
      import :: c_int, c_char, c_ptr, c_int64_t
      type(c_ptr), value :: f
      character(kind=c_char), dimension(*), intent(in) :: name, dtype
      integer(c_int), value :: ndim
      integer(c_int64_t), dimension(*), intent(in) :: shape
      type(c_ptr), value :: dims, attrs
      integer(c_int), value :: constant
    end function c_define_ex
    integer(c_int) function c_begin_step(f, step) bind(C, name="cairn_begin_step")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: f
      integer(c_int64_t), value :: step
    end function c_begin_step
    integer(c_int) function c_put_typed(f, var, dtype, data, ndim, offset, count) bind(C, name="cairn_put_typed")
      import :: c_int, c_char, c_ptr, c_int64_t
      type(c_ptr), value :: f
      character(kind=c_char), dimension(*), intent(in) :: var, dtype
      type(c_ptr), value :: data
      integer(c_int), value :: ndim
      integer(c_int64_t), dimension(*), intent(in) :: offset, count
    end function c_put_typed
    integer(c_int) function c_end_step(f) bind(C, name="cairn_end_step")
      import :: c_int, c_ptr
      type(c_ptr), value :: f
    end function c_end_step
    integer(c_int) function c_get(f, var, step, ndim, offset, count, out, out_bytes) bind(C, name="cairn_get")
      import :: c_int, c_char, c_ptr, c_int64_t, c_size_t
      type(c_ptr), value :: f
      character(kind=c_char), dimension(*), intent(in) :: var
      integer(c_int64_t), value :: step
      integer(c_int), value :: ndim
      integer(c_int64_t), dimension(*), intent(in) :: offset, count
      type(c_ptr), value :: out
      integer(c_size_t), value :: out_bytes
    end function c_get
    integer(c_int) function c_set_attr(f, var, key, value) bind(C, name="cairn_set_attr")
      import :: c_int, c_char, c_ptr
      type(c_ptr), value :: f
      character(kind=c_char), dimension(*), intent(in) :: var, key, value
    end function c_set_attr
    integer(c_int) function c_next_step(f, step) bind(C, name="cairn_next_step")
      import :: c_int, c_ptr, c_int64_t
      type(c_ptr), value :: f
      integer(c_int64_t), intent(out) :: step
    end function c_next_step
    integer(c_int) function c_halt_requested() bind(C, name="cairn_halt_requested")
      import :: c_int
    end function c_halt_requested
    integer(c_int) function c_halt_requested_all(f, halt) bind(C, name="cairn_halt_requested_all")
      import :: c_int, c_ptr
      type(c_ptr), value :: f
      integer(c_int), intent(out) :: halt
    end function c_halt_requested_all
    integer(c_int) function c_wait_drained(f, step, timeout_s, drained) bind(C, name="cairn_wait_drained")
      import :: c_int, c_ptr, c_int64_t, c_double
      type(c_ptr), value :: f
      integer(c_int64_t), value :: step
      real(c_double), value :: timeout_s
      integer(c_int), intent(out) :: drained
    end function c_wait_drained
    integer(c_int) function c_close(f) bind(C, name="cairn_close")
      import :: c_int, c_ptr
      type(c_ptr), value :: f
    end function c_close
    type(c_ptr) function c_last_error() bind(C, name="cairn_last_error")
      import :: c_ptr
    end function c_last_error
    integer(c_size_t) function c_strlen(s) bind(C, name="strlen")
      import :: c_size_t, c_ptr
      type(c_ptr), value :: s
    end function c_strlen
  end interface

contains

  !> `s` as a NUL-terminated C string.
  pure function cstr(s) result(c)
    character(*), intent(in) :: s
    character(kind=c_char), dimension(len_trim(s) + 1) :: c
    integer :: i
    do i = 1, len_trim(s)
      c(i) = s(i:i)
    end do
    c(len_trim(s) + 1) = c_null_char
  end function cstr

  !> `v` in reverse order (Fortran order to C order).
  pure function reversed(v) result(r)
    integer(8), intent(in) :: v(:)
    integer(c_int64_t) :: r(size(v))
    integer :: i
    do i = 1, size(v)
      r(i) = int(v(size(v) - i + 1), c_int64_t)
    end do
  end function reversed

  !> Opens dataset `name` with `mode` "w", "a" or "r"; `config` names a cairn.toml (default:
  !> $CAIRN_CONFIG, ./cairn.toml). With `comm` (an MPI communicator, e.g. MPI_COMM_WORLD;
  !> collective over it) writers take their rank and count from it and write as Python's `comm=`
  !> does (N→M aggregation and a collective commit with the file engine); else they are `rank` of
  !> `nranks` (default 0 of 1).
  subroutine cairn_open(f, name, mode, ierr, config, rank, nranks, comm)
    type(cairn_file), intent(out) :: f
    character(*), intent(in) :: name, mode
    integer, intent(out) :: ierr
    character(*), intent(in), optional :: config
    integer, intent(in), optional :: rank, nranks, comm
    character(kind=c_char), allocatable, target :: cfg(:)
    type(c_ptr) :: p
    integer(c_int) :: r, n
    r = 0
    n = 1
    if (present(rank)) r = int(rank, c_int)
    if (present(nranks)) n = int(nranks, c_int)
    p = c_null_ptr
    if (present(config)) then
      allocate(cfg(len_trim(config) + 1))
      cfg = cstr(config)
      p = c_loc(cfg)
    end if
    if (present(comm)) then
      ierr = int(c_open_mpi(cstr(name), cstr(mode), p, int(comm, c_int64_t), f%ptr))
    else
      ierr = int(c_open(cstr(name), cstr(mode), p, r, n, f%ptr))
    end if
  end subroutine cairn_open

  !> Defines a global variable of element type `dtype` ("f8", "f4", "i4", "i8") and `shape`
  !> (Fortran order); `dims` names its dimensions (Fortran order); `attrs` holds its attributes
  !> as a JSON object ('{"units": "K"}'); `constant` makes it step-invariant.
  subroutine cairn_define(f, name, dtype, shape, ierr, dims, constant, attrs)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: name, dtype
    integer(8), intent(in) :: shape(:)
    integer, intent(out) :: ierr
    character(*), intent(in), optional :: dims(:)
    logical, intent(in), optional :: constant
    character(*), intent(in), optional :: attrs
    character(kind=c_char), allocatable, target :: names(:, :), json(:)
    type(c_ptr), allocatable, target :: ptrs(:)
    type(c_ptr) :: p, a
    integer(c_int) :: k
    integer :: i, j, n
    p = c_null_ptr
    if (present(dims)) then
      n = size(dims)
      allocate(names(len(dims) + 1, n), ptrs(n))
      do j = 1, n  ! C order: the last Fortran dimension first
        names(:, j) = c_null_char
        do i = 1, len_trim(dims(n - j + 1))
          names(i, j) = dims(n - j + 1)(i:i)
        end do
        ptrs(j) = c_loc(names(1, j))
      end do
      p = c_loc(ptrs)
    end if
    k = 0
    if (present(constant)) then
      if (constant) k = 1
    end if
    a = c_null_ptr
    if (present(attrs)) then
      allocate(json(len_trim(attrs) + 1))
      json = cstr(attrs)
      a = c_loc(json)
    end if
    ierr = int(c_define_ex(f%ptr, cstr(name), cstr(dtype), int(size(shape), c_int), reversed(shape), p, a, k))
  end subroutine cairn_define

  !> Begins step `step`.
  subroutine cairn_begin_step(f, step, ierr)
    type(cairn_file), intent(in) :: f
    integer(8), intent(in) :: step
    integer, intent(out) :: ierr
    ierr = int(c_begin_step(f%ptr, int(step, c_int64_t)))
  end subroutine cairn_begin_step

  !> Ends the open step (it commits once every rank has ended it).
  subroutine cairn_end_step(f, ierr)
    type(cairn_file), intent(in) :: f
    integer, intent(out) :: ierr
    ierr = int(c_end_step(f%ptr))
  end subroutine cairn_end_step

  !> Where a writer resumes: the step after the last one committed when it was opened.
  subroutine cairn_next_step(f, step, ierr)
    type(cairn_file), intent(in) :: f
    integer(8), intent(out) :: step
    integer, intent(out) :: ierr
    integer(c_int64_t) :: s
    ierr = int(c_next_step(f%ptr, s))
    step = int(s, 8)
  end subroutine cairn_next_step

  !> Whether the job asks the application to stop now: `$CAIRN_HALT_FILE` exists, or fewer than
  !> `$CAIRN_HALT_SECONDS` remain before `$SLURM_JOB_END_TIME`.
  logical function cairn_halt_requested()
    cairn_halt_requested = c_halt_requested() == 1
  end function cairn_halt_requested

  !> Whether the job asks writer `f` to stop before the step it writes next: one answer for every
  !> rank (collective with `cairn_open_mpi`'s communicator; else the first rank to ask for a step
  !> fixes it). Ranks of a collective code ask this, not `cairn_halt_requested`.
  subroutine cairn_halt_requested_all(f, halt, ierr)
    type(cairn_file), intent(in) :: f
    logical, intent(out) :: halt
    integer, intent(out) :: ierr
    integer(c_int) :: h
    h = 0
    ierr = int(c_halt_requested_all(f%ptr, h))
    halt = h /= 0
  end subroutine cairn_halt_requested_all

  !> Waits up to `timeout_s` seconds (negative: no limit) until `step` (-1: the newest committed)
  !> is on the drain's disk, asking the drain for it whatever its cadence; `drained` says if it is.
  subroutine cairn_wait_drained(f, step, timeout_s, drained, ierr)
    type(cairn_file), intent(in) :: f
    integer(8), intent(in) :: step
    real(8), intent(in) :: timeout_s
    logical, intent(out) :: drained
    integer, intent(out) :: ierr
    integer(c_int) :: d
    d = 0
    ierr = int(c_wait_drained(f%ptr, int(step, c_int64_t), real(timeout_s, c_double), d))
    drained = d /= 0
  end subroutine cairn_wait_drained

  subroutine set_attr_text(f, var, key, value, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var, key, value
    integer, intent(out) :: ierr
    character(len=:), allocatable :: json
    integer :: i
    json = '"'
    do i = 1, len_trim(value)  ! JSON escapes: quote, backslash, control characters
      select case (iachar(value(i:i)))
      case (34, 92)
        json = json // '\' // value(i:i)
      case (0:31)
        json = json // ' '
      case default
        json = json // value(i:i)
      end select
    end do
    ierr = int(c_set_attr(f%ptr, cstr(var), cstr(key), cstr(json // '"')))
  end subroutine set_attr_text

  subroutine set_attr_r8(f, var, key, value, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var, key
    real(8), intent(in) :: value
    integer, intent(out) :: ierr
    character(len=40) :: json
    if (value /= value .or. abs(value) > huge(value)) then
      ierr = 6  ! CAIRN_ERR_INVALID_ARGUMENT: JSON has no NaN or infinity
      return
    end if
    write (json, '(es26.17e3)') value  ! 17 digits: the double round-trips
    ierr = int(c_set_attr(f%ptr, cstr(var), cstr(key), cstr(adjustl(json))))
  end subroutine set_attr_r8

  subroutine set_attr_i4(f, var, key, value, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var, key
    integer(4), intent(in) :: value
    integer, intent(out) :: ierr
    call set_attr_i8(f, var, key, int(value, 8), ierr)
  end subroutine set_attr_i4

  subroutine set_attr_i8(f, var, key, value, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var, key
    integer(8), intent(in) :: value
    integer, intent(out) :: ierr
    character(len=24) :: json
    write (json, '(i0)') value
    ierr = int(c_set_attr(f%ptr, cstr(var), cstr(key), cstr(json)))
  end subroutine set_attr_i8

  !> Closes the file.
  subroutine cairn_close(f, ierr)
    type(cairn_file), intent(inout) :: f
    integer, intent(out) :: ierr
    ierr = int(c_close(f%ptr))
    f%ptr = c_null_ptr
  end subroutine cairn_close

  !> The last error's message (of this thread's last failed call).
  subroutine cairn_error_message(msg)
    character(*), intent(out) :: msg
    character(kind=c_char), pointer :: c(:)
    type(c_ptr) :: p
    integer :: i, n
    msg = ""
    p = c_last_error()
    if (.not. c_associated(p)) return
    n = int(c_strlen(p))
    call c_f_pointer(p, c, [n])
    do i = 1, min(n, len(msg))
      msg(i:i) = c(i)
    end do
  end subroutine cairn_error_message

  subroutine put_raw(f, var, dtype, data, extents, offset, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var, dtype
    type(c_ptr), intent(in) :: data
    integer(8), intent(in) :: extents(:), offset(:)
    integer, intent(out) :: ierr
    if (size(offset) /= size(extents)) then
      ierr = 6  ! CAIRN_ERR_INVALID_ARGUMENT: one offset per dimension of the block
      return
    end if
    ierr = int(c_put_typed(f%ptr, cstr(var), cstr(dtype), data, int(size(extents), c_int), reversed(offset), reversed(extents)))
  end subroutine put_raw

  subroutine get_raw(f, var, step, offset, extents, data, bytes, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    integer(8), intent(in) :: step, offset(:), extents(:)
    type(c_ptr), intent(in) :: data
    integer(8), intent(in) :: bytes
    integer, intent(out) :: ierr
    if (size(offset) /= size(extents)) then
      ierr = 6
      return
    end if
    ierr = int(c_get(f%ptr, cstr(var), int(step, c_int64_t), int(size(extents), c_int), reversed(offset), &
                     reversed(extents), data, int(bytes, c_size_t)))
  end subroutine get_raw

  subroutine put_r8(f, var, block, offset, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    real(c_double), dimension(..), contiguous, target, intent(in) :: block
    integer(8), intent(in) :: offset(:)
    integer, intent(out) :: ierr
    call put_raw(f, var, "f8", c_loc(block), int(shape(block), 8), offset, ierr)
  end subroutine put_r8

  subroutine put_r4(f, var, block, offset, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    real(c_float), dimension(..), contiguous, target, intent(in) :: block
    integer(8), intent(in) :: offset(:)
    integer, intent(out) :: ierr
    call put_raw(f, var, "f4", c_loc(block), int(shape(block), 8), offset, ierr)
  end subroutine put_r4

  subroutine put_i4(f, var, block, offset, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    integer(c_int32_t), dimension(..), contiguous, target, intent(in) :: block
    integer(8), intent(in) :: offset(:)
    integer, intent(out) :: ierr
    call put_raw(f, var, "i4", c_loc(block), int(shape(block), 8), offset, ierr)
  end subroutine put_i4

  subroutine put_i8(f, var, block, offset, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    integer(c_int64_t), dimension(..), contiguous, target, intent(in) :: block
    integer(8), intent(in) :: offset(:)
    integer, intent(out) :: ierr
    call put_raw(f, var, "i8", c_loc(block), int(shape(block), 8), offset, ierr)
  end subroutine put_i8

  subroutine get_r8(f, var, step, offset, block, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    integer(8), intent(in) :: step, offset(:)
    real(c_double), dimension(..), contiguous, target, intent(inout) :: block
    integer, intent(out) :: ierr
    call get_raw(f, var, step, offset, int(shape(block), 8), c_loc(block), 8_8 * size(block, kind=8), ierr)
  end subroutine get_r8

  subroutine get_r4(f, var, step, offset, block, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    integer(8), intent(in) :: step, offset(:)
    real(c_float), dimension(..), contiguous, target, intent(inout) :: block
    integer, intent(out) :: ierr
    call get_raw(f, var, step, offset, int(shape(block), 8), c_loc(block), 4_8 * size(block, kind=8), ierr)
  end subroutine get_r4

  subroutine get_i4(f, var, step, offset, block, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    integer(8), intent(in) :: step, offset(:)
    integer(c_int32_t), dimension(..), contiguous, target, intent(inout) :: block
    integer, intent(out) :: ierr
    call get_raw(f, var, step, offset, int(shape(block), 8), c_loc(block), 4_8 * size(block, kind=8), ierr)
  end subroutine get_i4

  subroutine get_i8(f, var, step, offset, block, ierr)
    type(cairn_file), intent(in) :: f
    character(*), intent(in) :: var
    integer(8), intent(in) :: step, offset(:)
    integer(c_int64_t), dimension(..), contiguous, target, intent(inout) :: block
    integer, intent(out) :: ierr
    call get_raw(f, var, step, offset, int(shape(block), 8), c_loc(block), 8_8 * size(block, kind=8), ierr)
  end subroutine get_i8

end module cairn
