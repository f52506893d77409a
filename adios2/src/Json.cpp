#include "Json.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace cairn_adios2
{
namespace
{

struct Parser
{
    const std::string &s;
    size_t i = 0;

    [[noreturn]] void Bad(const char *what) const
    {
        throw std::invalid_argument("Cairn engine: attributes JSON: " + std::string(what) +
                                    " at byte " + std::to_string(i));
    }
    void Space()
    {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r'))
        {
            ++i;
        }
    }
    bool Eat(char c)
    {
        Space();
        if (i < s.size() && s[i] == c)
        {
            ++i;
            return true;
        }
        return false;
    }
    std::string String()
    {
        if (!Eat('"'))
        {
            Bad("expected a string");
        }
        std::string out;
        while (i < s.size() && s[i] != '"')
        {
            char c = s[i++];
            if (c != '\\')
            {
                out += c;
                continue;
            }
            if (i >= s.size())
            {
                Bad("unfinished escape");
            }
            c = s[i++];
            switch (c)
            {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'u':
            {
                if (i + 4 > s.size())
                {
                    Bad("short \\u escape");
                }
                unsigned cp = std::strtoul(s.substr(i, 4).c_str(), nullptr, 16);
                i += 4;
                if (cp < 0x80)
                {
                    out += static_cast<char>(cp);
                }
                else if (cp < 0x800)
                {
                    out += static_cast<char>(0xC0 | (cp >> 6));
                    out += static_cast<char>(0x80 | (cp & 0x3F));
                }
                else
                {
                    out += static_cast<char>(0xE0 | (cp >> 12));
                    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
                    out += static_cast<char>(0x80 | (cp & 0x3F));
                }
                break;
            }
            default: out += c;
            }
        }
        if (i >= s.size())
        {
            Bad("unfinished string");
        }
        ++i;
        return out;
    }
    Json Value()
    {
        Space();
        if (i >= s.size())
        {
            Bad("expected a value");
        }
        Json v;
        const char c = s[i];
        if (c == '"')
        {
            v.kind = Json::Kind::String;
            v.text = String();
        }
        else if (c == '[')
        {
            ++i;
            v.kind = Json::Kind::Array;
            if (!Eat(']'))
            {
                do
                {
                    v.items.push_back(Value());
                } while (Eat(','));
                if (!Eat(']'))
                {
                    Bad("expected ']'");
                }
            }
        }
        else if (c == '{')
        {
            ++i;
            v.kind = Json::Kind::Object;
            if (!Eat('}'))
            {
                do
                {
                    std::string key = String();
                    if (!Eat(':'))
                    {
                        Bad("expected ':'");
                    }
                    v.members.emplace_back(std::move(key), Value());
                } while (Eat(','));
                if (!Eat('}'))
                {
                    Bad("expected '}'");
                }
            }
        }
        else if (s.compare(i, 4, "true") == 0 || s.compare(i, 5, "false") == 0)
        {
            v.kind = Json::Kind::Bool;
            v.boolean = s[i] == 't';
            i += v.boolean ? 4 : 5;
        }
        else if (s.compare(i, 4, "null") == 0)
        {
            i += 4;
        }
        else
        {
            const size_t start = i;
            bool fractional = false;
            while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) ||
                                    s[i] == '-' || s[i] == '+' || s[i] == '.' || s[i] == 'e' ||
                                    s[i] == 'E'))
            {
                fractional |= s[i] == '.' || s[i] == 'e' || s[i] == 'E';
                ++i;
            }
            if (start == i)
            {
                Bad("unexpected character");
            }
            const std::string num = s.substr(start, i - start);
            if (fractional)
            {
                v.kind = Json::Kind::Float;
                v.number = std::strtod(num.c_str(), nullptr);
            }
            else
            {
                v.kind = Json::Kind::Int;
                v.integer = std::strtoll(num.c_str(), nullptr, 10);
                v.number = static_cast<double>(v.integer);
            }
        }
        return v;
    }
};

} // namespace

Json ParseJson(const std::string &text)
{
    Parser p{text};
    Json v = p.Value();
    p.Space();
    if (p.i != text.size())
    {
        p.Bad("trailing text");
    }
    return v;
}

std::string JsonQuote(const std::string &s)
{
    std::string out = "\"";
    for (const char c : s)
    {
        switch (c)
        {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\t': out += "\\t"; break;
        case '\r': out += "\\r"; break;
        default:
            if (static_cast<unsigned char>(c) < 0x20)
            {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out += buf;
            }
            else
            {
                out += c;
            }
        }
    }
    return out + "\"";
}

std::string JsonNumber(double v, const std::string &what)
{
    if (!std::isfinite(v))
    {
        throw std::invalid_argument("Cairn engine: " + what +
                                    " is NaN or infinite, which Cairn's JSON attributes cannot hold");
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return buf;
}

} // namespace cairn_adios2
