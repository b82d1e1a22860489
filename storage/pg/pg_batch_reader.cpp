#include "storage/pg/pg_batch_reader.hpp"

#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "storage/pg/pg_binary.hpp"

namespace idemgate::storage::pg {
namespace {

namespace asio = boost::asio;

// One find() call in a batch.
struct LookupItem final : BatchItem {
  LookupItem(asio::any_io_executor executor, std::string key, Deadline deadline)
      : BatchItem(std::move(executor), deadline), id_bytes(std::move(key)) {}

  std::string_view id() const noexcept override { return id_bytes; }
  void fail(boost::system::error_code ec) override {
    if (settle_once()) outcome.emplace(boost::system::in_place_error, ec);
  }
  void settle(FoundRow found) {
    if (settle_once()) outcome.emplace(boost::system::in_place_value, std::move(found));
  }

  std::string id_bytes;
  std::optional<boost::system::result<FoundRow>> outcome;
};

// One batch: one statement on one pooled connection; each item gets its row, or none.
asio::awaitable<void> send_lookups(PgPool& pool, Statement statement,
                                   const StatementBatch::Items& batch, Deadline until) {
  std::size_t id_bytes = 0;
  for (const auto& item : batch) id_bytes += item->id().size();
  binary::Array ids(binary::kByteaOid, batch.size(), id_bytes);
  for (const auto& item : batch) ids.element(item->id());
  std::vector<Param> params;
  params.push_back(Param::bytes(ids.take()));

  boost::system::result<PgResult> found = core::store_errc::unavailable;
  auto lease = co_await pool.acquire(until);
  if (!lease) {
    found = lease.error();
  } else {
    found = co_await (*lease)->execute(statement, std::move(params), until);
  }
  if (!found) {
    for (const auto& item : batch) item->fail(found.error());
    co_return;
  }
  auto rows = std::make_shared<const PgResult>(std::move(*found));
  if (rows->rows() > 0 && rows->columns() < 1) {
    for (const auto& item : batch) item->fail(make_error_code(core::store_errc::protocol));
    co_return;
  }
  std::unordered_map<std::string_view, int> by_id;
  const int id_column = rows->columns() - 1;
  for (int row = 0; row < rows->rows(); ++row) by_id.emplace(rows->bytes(row, id_column), row);
  for (const auto& item : batch) {
    const auto it = by_id.find(item->id());
    auto& lookup = static_cast<LookupItem&>(*item);
    if (it == by_id.end()) {
      lookup.settle(FoundRow{});
    } else {
      lookup.settle(FoundRow{rows, it->second});
    }
  }
}

}  // namespace

PgBatchReader::PgBatchReader(asio::any_io_executor executor, PgPool& pool, Statement statement,
                             Options options)
    : batch_(std::move(executor), options,
             [pool = &pool, statement](const StatementBatch::Items& items, Deadline until) {
               return send_lookups(*pool, statement, items, until);
             }) {}

asio::awaitable<boost::system::result<FoundRow>> PgBatchReader::find(std::string id,
                                                                     Deadline deadline) {
  auto item = std::make_shared<LookupItem>(batch_.executor(), std::move(id), deadline);
  if (!co_await batch_.submit(item)) co_return core::store_errc::timed_out;
  co_return std::move(*item->outcome);
}

std::uint64_t PgBatchReader::batches_sent() const noexcept {
  return batch_.batches_sent();
}

std::uint64_t PgBatchReader::lookups_sent() const noexcept {
  return batch_.items_sent();
}

}  // namespace idemgate::storage::pg
