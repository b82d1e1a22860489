#pragma once
// Redis Cluster routing (SPEC C42): hash slots, the slot map and the routing that sends each
// command to the primary owning its key's slot. hiredis 0.14 has no cluster support; this is the
// small part of a cluster client the lock needs: one key per command, no multi-key operations.

#include <boost/asio/any_io_executor.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gateway/config/config.hpp"
#include "storage/redis/redis_connection.hpp"

namespace idemgate::storage::redis {

/// The cluster's number of hash slots.
inline constexpr std::uint16_t kClusterSlots = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag (the bytes between the
/// first `{` and the next `}` when that is not empty), modulo 16384 (Redis Cluster
/// specification, "Keys distribution model").
std::uint16_t key_slot(std::string_view key) noexcept;

/// One range of slots and the primary serving it.
struct SlotRange {
  std::uint16_t first = 0;
  std::uint16_t last = 0;  ///< inclusive
  std::string host;
  std::uint16_t port = 0;
};

/// Parses a `CLUSTER SLOTS` reply into ranges (replicas are ignored). An empty host (a node that
/// does not know its own address) becomes `asked_host`. nullopt when the reply has another shape.
std::optional<std::vector<SlotRange>> parse_cluster_slots(const Reply& reply,
                                                          const std::string& asked_host);

/// The cluster routing (redis_routing.hpp: cluster_routing), for `options.mode == cluster`.
///
/// The slot map comes from `CLUSTER SLOTS`, asked of the seed nodes (`options.cluster`) in turn,
/// then of the primaries known so far, when the first command or probe runs; one
/// RedisConnection (AUTH as configured, db 0) per primary. A command goes to the primary of
/// `key_slot(key)` ("" goes to any primary). A `MOVED` reloads the map (one reload at a time;
/// concurrent callers wait for it). A store error on a node (connection lost, timed out), a
/// not-primary or cluster-down answer marks the map stale, so the next command reloads it: a
/// failover gives the node's slots to a promoted replica. Connections to nodes that serve no
/// slot any more are dropped; their undos (RedisConnection) go to the nodes serving their keys.
///
/// Primary switches (SPEC C46): after each reload, every range is reported to the tracker (may
/// be null) with its first slot as the scope. A failover that gives a range to the promoted
/// replica counts once per process. A reshard that hands a range's first slot to another
/// primary counts too: from the gateway's side it is the same event (that range's lock keys now
/// live on another server), and telling the two apart would need node roles over time, which
/// `CLUSTER SLOTS` does not give. Ranges whose first slot is new (a reshard splitting a range)
/// are recorded without counting.

}  // namespace idemgate::storage::redis
