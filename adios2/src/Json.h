// The little JSON the engine needs: Cairn's attributes travel as JSON through the C API.
#ifndef CAIRN_ADIOS2_JSON_H
#define CAIRN_ADIOS2_JSON_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cairn_adios2
{

/// A parsed JSON value.
struct Json
{
    enum class Kind
    {
        Null,
        Bool,
        Int,
        Float,
        String,
        Array,
        Object
    };
    Kind kind = Kind::Null;
    bool boolean = false;
    int64_t integer = 0;
    double number = 0;
    std::string text;
    std::vector<Json> items;
    std::vector<std::pair<std::string, Json>> members;
};

/// Parses `text`; std::invalid_argument says where it does not parse.
Json ParseJson(const std::string &text);

/// `s` as a JSON string literal.
std::string JsonQuote(const std::string &s);

/// `v` as a JSON number (std::invalid_argument for NaN and infinities, which JSON lacks).
std::string JsonNumber(double v, const std::string &what);

} // namespace cairn_adios2

#endif
