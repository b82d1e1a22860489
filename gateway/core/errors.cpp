#include "gateway/core/errors.hpp"

namespace idemgate::core {
namespace {

class StoreCategory final : public boost::system::error_category {
 public:
  const char* name() const noexcept override { return "idemgate.store"; }
  std::string message(int ev) const override {
    switch (static_cast<store_errc>(ev)) {
      case store_errc::unavailable:
        return "store unavailable";
      case store_errc::timed_out:
        return "store operation timed out";
      case store_errc::protocol:
        return "unexpected answer from store";
      case store_errc::conflict:
        return "uniqueness conflict";
    }
    return "unknown store error";
  }
};

}  // namespace

const boost::system::error_category& store_category() noexcept {
  static const StoreCategory category;
  return category;
}

}  // namespace idemgate::core
