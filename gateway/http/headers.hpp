#pragma once
// Header-field rules of a proxy (RFC 9110 §7.6): hop-by-hop stripping in both directions,
// X-Forwarded-*, Via, and small field helpers. Pure functions on Beast field containers.

#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/container/small_vector.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace idemgate::http {

using Fields = boost::beast::http::fields;

/// The `Via` entry this gateway adds to requests and responses (SPEC C02).
inline constexpr std::string_view kViaEntry = "1.1 idemgate";

/// The first field named `name` (compared case-insensitively), found by one pass over the
/// message's fields; fields.end() when none. Beast's own find() walks its name index with a
/// case-insensitive compare at each node: for the handful of fields a message has, that costs
/// several times more.
Fields::const_iterator find_field(const Fields& fields, std::string_view name);
/// The next field after `after` (not fields.end()) with the same name; fields.end() when none.
Fields::const_iterator find_next_field(const Fields& fields, Fields::const_iterator after);
/// The same for a field Beast knows by name: compared by its enum alone.
Fields::const_iterator find_field(const Fields& fields, boost::beast::http::field name);
/// Erases every field whose name is one of `names` (case-insensitive), in one pass.
void erase_fields(Fields& fields, std::initializer_list<std::string_view> names);

/// Field lines the gateway adds to a message it forwards (forwarding fields, Via, Date, the
/// request id), rendered once as `Name: value\r\n` each. render_head writes them after the
/// message's own fields, so that a forwarded head costs no field element (an allocation) per
/// added field; where Beast's serializer writes a head, insert_into() makes them fields first.
/// Up to about 250 bytes of lines need no allocation.
class AddedFields {
 public:
  /// Adds the line `name: value`. Neither may hold CR or LF (the caller's values are a
  /// configured name, a parsed field value or the gateway's own text).
  void add(std::string_view name, std::string_view value);
  /// The lines, in the order they were added; empty when none.
  std::string_view lines() const { return {text_.data(), text_.size()}; }
  bool empty() const { return text_.empty(); }
  void clear() { text_.clear(); }
  /// Appends each line to `fields` as a field, in order.
  void insert_into(Fields& fields) const;
  /// Whether a line is named `name` (case-insensitive, RFC 9110 §5.1).
  bool has(std::string_view name) const;

 private:
  /// Calls `visit(name, value)` for each line in order until it returns true; whether one did.
  template <class Visit>
  bool each(Visit visit) const;

  boost::container::small_vector<char, 256> text_;
};

/// Removes the hop-by-hop fields of SPEC C02 (RFC 9110 §7.6.1): `Connection` and every field
/// it names, `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`,
/// `Proxy-Authorization`, `Proxy-Authenticate`. All other fields keep their order and repeats;
/// `Host` is never removed, even when `Connection` names it.
/// Used for requests and responses alike.
void strip_hop_by_hop(Fields& fields);

/// Appends `value` to the comma-separated list of field `name`: repeated fields are joined into
/// one (RFC 9110 §5.3 makes that equivalent) and `value` goes last. Adds the field if absent.
void append_to_list(Fields& fields, std::string_view name, std::string_view value);

/// The same, with `value` added to `added` instead when the message has no `name` field (the
/// usual case: no field element for it).
void append_to_list(Fields& fields, std::string_view name, std::string_view value,
                    AddedFields& added);

/// Beast's keep_alive(keep_alive) on `message`, without its lookups where it would change
/// nothing: an HTTP/1.1 message without a Connection field is kept alive already.
template <bool isRequest, class Body>
void set_keep_alive(boost::beast::http::message<isRequest, Body, Fields>& message,
                    bool keep_alive) {
  if (keep_alive && message.version() >= 11 &&
      find_field(message, boost::beast::http::field::connection) == message.end()) {
    return;
  }
  message.keep_alive(keep_alive);
}

/// Sets `Content-Length` to `length`; one field that says so already is left as it is (no
/// allocation). A list of equal lengths ("3, 3", or the field twice) becomes the one value
/// (RFC 9110 §8.6, C03).
void set_content_length(Fields& fields, std::uint64_t length);

/// Adds the forwarding fields of SPEC C02 to a request: appends `client_ip` to
/// `X-Forwarded-For`, sets `X-Forwarded-Proto` to `proto` and `X-Forwarded-Host` to the `Host`
/// value (removed when there is no Host), and appends `Via: 1.1 idemgate`. `Host` is untouched.
void add_forwarding_fields(Fields& fields, std::string_view client_ip, std::string_view proto);
/// The same, with each field the request does not carry yet added to `added` instead (the
/// usual case: no field element for it); a field it carries is changed in `fields` as above.
void add_forwarding_fields(Fields& fields, std::string_view client_ip, std::string_view proto,
                           AddedFields& added);

/// Puts `value` in the field `name` in place of any the message has: the message's are erased
/// and the line is added to `added` (RFC 9110 §5.3: the field then has that one value).
void replace_field(Fields& fields, std::string_view name, std::string_view value,
                   AddedFields& added);

/// True when some `name` field's token list (Beast's http::token_list, RFC 9110 §5.6.1) holds
/// `token` (case-insensitive). A list that stops being valid yields its tokens up to there.
bool has_token(const Fields& fields, std::string_view name, std::string_view token);

/// True when some `Upgrade` field lists `protocol` (a protocol-name, compared case-insensitively
/// and without any `/version`; RFC 9110 §7.8). A `101` must name the protocol the client asked
/// for (SPEC C40).
bool upgrade_names(const Fields& fields, std::string_view protocol);

/// The `timeout=N` parameter of a `Keep-Alive` field (seconds), if any (C08).
std::optional<std::chrono::seconds> keep_alive_timeout(const Fields& fields);

/// False for the statuses that never have a body (1xx, 204, 304; RFC 9110 §6.4.1).
bool status_has_body(unsigned status);

/// Whether `extensions` (what follows the chunk size on a chunk-size line, CRLF excluded) is a
/// valid chunk-ext of RFC 9112 §7.1.1: *( BWS ";" BWS name [ BWS "=" BWS ( token /
/// quoted-string ) ] ), names tokens, quoted strings of qdtext and quoted-pairs (RFC 9110
/// §5.6.4). Beast 1.81 checks the token forms but takes any byte but `"` and `\` inside a quoted
/// value, a bare LF, NUL or DEL included; a front proxy reading such an LF as a line end would
/// frame the body differently (SPEC C03), so the gateway checks the whole grammar itself.
bool valid_chunk_extensions(std::string_view extensions);

/// Adds what the gateway puts on every answer (C02, C32): a fresh `Date` in place of any, `Via`
/// appended, and `request_id` (when not empty) as the field `id_field` in place of any. Fields
/// the answer does not carry become lines of `added` (replace_field, append_to_list).
void add_answer_fields(Fields& fields, std::string_view id_field, std::string_view request_id,
                       AddedFields& added);

/// Makes a held answer's fields what the client gets, over HTTP/1.1 and HTTP/2 alike: hop-by-hop
/// fields removed (C02), `request_id` (when not empty) set as the field `id_field` (C32), a fresh
/// `Date`, `Via` appended, and its framing (C03, C16): neither body nor Content-Length for 1xx,
/// 204 and 304; for a HEAD the handler's Content-Length without the body; otherwise the body's
/// Content-Length.
void finalize_answer(boost::beast::http::response<boost::beast::http::string_body>& res, bool head,
                     std::string_view id_field, std::string_view request_id);

/// Writes the bytes HTTP/1.1 puts on the wire for `header` (RFC 9112 §2.1) into [out, out +
/// capacity): the status line (the reason phrase as received, else the status's standard one,
/// else none), every field as it is, in order, and the empty line; the bytes Beast's serializer
/// writes for it, but for a status without a standard phrase. Returns their count, or 0 when
/// they do not fit (the caller then serializes as usual).
/// `added` (AddedFields::lines) goes after the fields.
std::size_t render_head(const boost::beast::http::response_header<>& header, char* out,
                        std::size_t capacity, std::string_view added = {});
/// The same for a request: the request line (method, target, version), the fields, the empty line.
std::size_t render_head(const boost::beast::http::request_header<>& header, char* out,
                        std::size_t capacity, std::string_view added = {});

}  // namespace idemgate::http
