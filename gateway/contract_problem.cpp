#include "gateway/contract_problem.hpp"

namespace idemgate {

http::ProblemInfo describe(ContractProblem problem) {
  switch (problem) {
    case ContractProblem::missing_key:
      return {"https://idemgate.dev/problems/missing-key", "Idempotency key required", 400};
    case ContractProblem::invalid_key:
      return {"https://idemgate.dev/problems/invalid-key", "Invalid idempotency key", 400};
    case ContractProblem::key_mismatch:
      return {"https://idemgate.dev/problems/key-mismatch",
              "Idempotency key reused with a different request", 422};
    case ContractProblem::request_in_flight:
      return {"https://idemgate.dev/problems/request-in-flight",
              "A request with this idempotency key is in progress", 409};
    case ContractProblem::store_unavailable:
      return {"https://idemgate.dev/problems/store-unavailable", "Idempotency store unavailable",
              503};
  }
  return {"https://idemgate.dev/problems/internal-error", "Internal gateway error", 500};
}

http::Response make_problem(ContractProblem problem, std::string detail, unsigned status) {
  const http::ProblemInfo info = describe(problem);
  return http::make_problem(info, status != 0 ? status : info.status, std::move(detail), 11, true);
}

}  // namespace idemgate
