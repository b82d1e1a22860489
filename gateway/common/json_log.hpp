#pragma once
// Structured log lines: every message the gateway logs is one JSON object (SPEC C32), written
// through spdlog's default logger, which main points at stderr.

#include <spdlog/common.h>
#include <spdlog/formatter.h>
#include <spdlog/logger.h>
#include <boost/json/object.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

namespace idemgate::common {

/// Logs `{"time", "level", "msg": msg, fields...}` as one JSON object on spdlog's default logger.
/// A `time` field in `fields` (RFC 3339 text) replaces the current time; doubles are written with
/// three decimals (durations in ms).
/// Thread safety: safe from any thread (spdlog's default logger is thread-safe).
void log_json(spdlog::level::level_enum level, std::string_view msg,
              boost::json::object fields = {});

/// The access line of one request (SPEC C32), exactly as `log_json(info, "access", {time, route,
/// method, target, status, outcome, key_hash, upstream_ms, total_ms, client, written,
/// request_id, trace_id})` writes it, rendered into a buffer the thread reuses instead of
/// through a boost::json::object. `request_id` is the request's id ("" when it has none),
/// `trace_id` the trace id of its valid `traceparent` ("" when none; conf/REFERENCE.md).
/// `ended`, when not empty, is added last as the field `ended`: how an exchange that did not run
/// to its end ended (`client_closed`, SPEC C48). `protocol`, when not empty, is added after it as
/// the field `protocol` (`h2` for a request that came as an HTTP/2 stream, SPEC C49).
/// Thread safety: as log_json.
void log_access(std::chrono::system_clock::time_point time, std::string_view route,
                std::string_view method, std::string_view target, unsigned status,
                std::string_view outcome, std::string_view key_hash, double upstream_ms,
                double total_ms, std::string_view client, bool written, std::string_view request_id,
                std::string_view trace_id, std::string_view ended = {},
                std::string_view protocol = {});

/// A logger that writes JSON lines (make_json_formatter) to `fd` (stderr; a test's pipe) without
/// making the logging thread wait for it: each thread appends its lines to a buffer of its own
/// and one writer thread writes them. Access lines (log_access) are batched: written every
/// 50 ms, or when a buffer holds 32 KiB; any other line (warnings, start-up, reloads, the
/// cleaner's rounds) wakes the writer at once; all are written on flush() and when the logger is
/// destroyed. Lines never
/// interleave; a thread's lines keep their order. A thread whose buffer already holds 1 MiB
/// (`fd` blocked or too slow) drops its new lines: they are counted, and the count is written as
/// a `warning` line `{"msg":"log lines dropped: …","dropped":N}` once the writer catches up.
/// flush() blocks until every line logged before it has been written (up to 2 s): call it before
/// the process exits. Lines still buffered when the process dies abruptly are lost.
std::shared_ptr<spdlog::logger> make_batched_logger(const std::string& name, int fd = 2);

/// A spdlog formatter that writes every message as one JSON object a line: messages from
/// log_json as they are, any other text (library notices, plain spdlog calls) wrapped as
/// {"time","level","msg"}. main installs it on the default logger.
std::unique_ptr<spdlog::formatter> make_json_formatter();

/// `t` as an RFC 3339 UTC timestamp with milliseconds, e.g. `2026-01-31T12:00:00.123Z`.
std::string format_rfc3339(std::chrono::system_clock::time_point t);

}  // namespace idemgate::common
