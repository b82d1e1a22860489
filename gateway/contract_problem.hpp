#pragma once
// The idempotency contract's own problem details (RFC 9457, SPEC C33): the conditions the
// idempotency handler answers itself, each with a stable `type` URI under
// https://idemgate.dev/problems/ that clients may branch on. The proxy's own problems are in
// gateway/http/problem.hpp.

#include <string>

#include "gateway/http/problem.hpp"

namespace idemgate {

/// The conditions of the contract.
enum class ContractProblem {
  missing_key,        ///< 400 `missing-key`: required key absent (C10)
  invalid_key,        ///< 400 `invalid-key`: key syntax (C13, C37)
  key_mismatch,       ///< 422 `key-mismatch` by default; status per on_mismatch (C17)
  request_in_flight,  ///< 409 `request-in-flight`: same key still executing (C18)
  store_unavailable,  ///< 503 `store-unavailable`: fail_closed store error (C25)
};

/// The type, title and default status of `problem`. Pure.
http::ProblemInfo describe(ContractProblem problem);

/// A problem+json response for `problem` (http::make_problem) with its default status, or
/// `status` when it is not 0 (key_mismatch per on_mismatch). HTTP/1.1, keep-alive.
http::Response make_problem(ContractProblem problem, std::string detail, unsigned status = 0);

}  // namespace idemgate
