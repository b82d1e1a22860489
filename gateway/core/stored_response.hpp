#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gateway/core/hash.hpp"

namespace idemgate::core {

/// An end-to-end header field as stored: name as received, value, in order (SPEC C16).
using HeaderField = std::pair<std::string, std::string>;

/// The part of an upstream response that is kept and replayed (SPEC C16, C29).
struct StoredResponse {
  std::uint16_t status = 0;
  std::vector<HeaderField> headers;  ///< end-to-end fields only, in order, repeats kept
  std::string body;                  ///< decoded body bytes; empty when body_omitted
  bool body_omitted = false;         ///< body was over max_stored_response (C29, C39)
};

/// A durable record of a completed request (one row of `idempotency_record`).
struct StoredRecord {
  Sha256 id{};           ///< record_id(scope, key): the primary key, never the raw key (C23)
  std::string route;     ///< route name, for operators
  Sha256 fingerprint{};  ///< request fingerprint (SPEC §4)
  StoredResponse response;
  std::chrono::system_clock::time_point created_at{};  ///< filled by the store
  std::chrono::system_clock::time_point expires_at{};  ///< filled by the store
};

}  // namespace idemgate::core
