# find_package(Cairn): the imported targets Cairn::cairn (libcairn.so and cairn.h) and
# Cairn::cairn_fortran (the Fortran module, where it was built), found relative
# to this file, so an installed tree can be moved as a whole. CMake gives executables linked to it
# a build rpath to the library; installed programs need their own (INSTALL_RPATH) or LD_LIBRARY_PATH.
get_filename_component(_cairn_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET Cairn::cairn)
  add_library(Cairn::cairn SHARED IMPORTED)
  set_target_properties(Cairn::cairn PROPERTIES
    IMPORTED_LOCATION "${_cairn_prefix}/lib/libcairn.so"
    INTERFACE_INCLUDE_DIRECTORIES "${_cairn_prefix}/include")
endif()
if(EXISTS "${_cairn_prefix}/lib/libcairn_fortran.so" AND NOT TARGET Cairn::cairn_fortran)
  # The Fortran module (cairn.mod is gfortran's: build with the same compiler).
  add_library(Cairn::cairn_fortran SHARED IMPORTED)
  set_target_properties(Cairn::cairn_fortran PROPERTIES
    IMPORTED_LOCATION "${_cairn_prefix}/lib/libcairn_fortran.so"
    IMPORTED_NO_SONAME TRUE
    INTERFACE_INCLUDE_DIRECTORIES "${_cairn_prefix}/include"
    INTERFACE_LINK_LIBRARIES Cairn::cairn)
endif()
set(Cairn_INCLUDE_DIRS "${_cairn_prefix}/include")
set(Cairn_LIBRARIES Cairn::cairn)
set(Cairn_SERVER "${_cairn_prefix}/bin/cairn-server")
set(Cairn_FOUND TRUE)
