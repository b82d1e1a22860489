#pragma once
// The only durations a test may assert as upper bounds: those SPEC states, each with the margin
// the tests add to it. Everything else a test waits for is an event, awaited with a safety
// deadline (e2e::kEventDeadline) that only turns a hang into a failure and measures nothing.
//
// A margin covers what the test adds to the measured span on a shared machine running the
// sanitizers: scheduling of the test's own threads, the request around the store operation, and
// how the test observes the moment it measures from. Every assertion that uses one of these
// names the SPEC case next to it.

#include <chrono>

namespace idemgate::test::spec {

/// SPEC C25: an operation past its `operation_timeout` is a store error and "no request ever
/// hangs on a store", so a request that meets a store fault is answered once the operation it
/// waits on has run out its operation_timeout. Margin on top of that operation_timeout: the rest
/// of the request (lock, forward, answer) and the loaded machine.
inline constexpr std::chrono::milliseconds kStoreFaultMargin{1000};

/// SPEC C41 (Redis Sentinel: "keyed requests succeed again within 1 s of the promotion") and
/// C43 (Postgres: "new keys execute within 1 s of the moment the promoted standby accepts
/// read-write sessions").
inline constexpr std::chrono::milliseconds kAfterPromotion{1000};
/// Margin on kAfterPromotion. The promotion is observed by polling on the early side (which only
/// lengthens the measured span); the request that shows the recovery is one of a client sending a
/// new key every few milliseconds, and its own round trip (under the sanitizers) ends the span.
inline constexpr std::chrono::milliseconds kAfterPromotionMargin{500};

/// SPEC C48: "the upstream connection is closed within 1 s" of the client closing or resetting
/// its connection. Measured with kCloseMargin on top.
inline constexpr std::chrono::milliseconds kUpstreamCloseAfterClient{1000};

/// Margin on a moment SPEC names for a close: SPEC C40 "SIGTERM closes tunnels at the end of
/// `drain_timeout`". The close follows the drain's timer; the margin covers the test's reading
/// thread and the gateway's shutdown of the connection on a loaded machine.
inline constexpr std::chrono::milliseconds kCloseMargin{1000};

}  // namespace idemgate::test::spec
