// ADIOS2's element types as Cairn's dtypes, and the selection a variable carries.
#ifndef CAIRN_ADIOS2_TYPES_H
#define CAIRN_ADIOS2_TYPES_H

#include "adios2/common/Selection.h"
#include "adios2/cxx/Variable.h"

#include <complex>
#include <cstdint>
#include <string>
#include <type_traits>

namespace cairn_adios2
{

/// Cairn's dtype of ADIOS2 type T, or nullptr where Cairn has none (strings, long double).
template <class T>
const char *DTypeOf()
{
    if constexpr (std::is_same_v<T, int8_t> || std::is_same_v<T, char>)
        return "i1";
    else if constexpr (std::is_same_v<T, int16_t>)
        return "i2";
    else if constexpr (std::is_same_v<T, int32_t>)
        return "i4";
    else if constexpr (std::is_same_v<T, int64_t>)
        return "i8";
    else if constexpr (std::is_same_v<T, uint8_t>)
        return "u1";
    else if constexpr (std::is_same_v<T, uint16_t>)
        return "u2";
    else if constexpr (std::is_same_v<T, uint32_t>)
        return "u4";
    else if constexpr (std::is_same_v<T, uint64_t>)
        return "u8";
    else if constexpr (std::is_same_v<T, float>)
        return "f4";
    else if constexpr (std::is_same_v<T, double>)
        return "f8";
    else if constexpr (std::is_same_v<T, std::complex<float>>)
        return "c8";
    else if constexpr (std::is_same_v<T, std::complex<double>>)
        return "c16";
    else
        return nullptr;
}

/// The selection ADIOS2 keeps in variable `v` (box or block, steps, memory), as its own engines
/// receive it: ADIOS2's exported core::InferSelection over the core variable the public handle
/// wraps. A plugin is handed only the public handle, whose selection getters cannot tell a
/// block selection from a box (the core asks only its own engines for a block's box).
template <class T>
adios2::core::Selection SelectionOf(const adios2::Variable<T> &v); // CairnEngine.cpp, for every type

} // namespace cairn_adios2

#endif
