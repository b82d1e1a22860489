#pragma once
// The core::RecordStore contract (SPEC C16, C24, C29, C36) as Boost.Test cases that run against
// every backend, so the real store and the in-memory fake cannot drift apart.
//
// Use: in a test file that defines BOOST_TEST_MODULE, include record_store_fixtures.hpp, declare
//   namespace idemgate::testing { using RecordStoreBackends = std::tuple<MyBackend>; }
// and then include this header. A backend is default-constructible (a fresh store per case; ids
// are random, so backends sharing a database need no cleanup) and provides:
//   core::RecordStore& store();
//   template <class T> T run(boost::asio::awaitable<T> op);   // drives op to completion
//   boost::asio::awaitable<void> wait_until_expired(core::Sha256 id);
//       // returns once the store's clock is past the record's expires_at

#include <boost/test/unit_test.hpp>
#include <chrono>

#include "tests/storage/record_store_fixtures.hpp"

BOOST_AUTO_TEST_SUITE(record_store_contract)

BOOST_AUTO_TEST_CASE_TEMPLATE(find_returns_nothing_for_an_unknown_id, Backend,
                              idemgate::testing::RecordStoreBackends) {
  Backend backend;
  auto found = backend.run(backend.store().find(idemgate::testing::random_id()));
  BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
  BOOST_TEST(!found->has_value());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(spec_C16_find_returns_the_inserted_status_headers_and_body_bytes,
                              Backend, idemgate::testing::RecordStoreBackends) {
  using namespace idemgate::testing;
  Backend backend;
  const auto record = sample_record("first");

  auto inserted = backend.run(backend.store().insert(record, kLongTtl));
  BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  BOOST_TEST(inserted->inserted);
  BOOST_TEST(!inserted->existing.has_value());

  auto found = backend.run(backend.store().find(record.id));
  BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
  BOOST_TEST_REQUIRE(found->has_value());
  check_same_response(**found, record);
  BOOST_TEST(((*found)->expires_at > (*found)->created_at));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(empty_headers_and_empty_body_round_trip, Backend,
                              idemgate::testing::RecordStoreBackends) {
  using namespace idemgate::testing;
  Backend backend;
  auto record = sample_record("empty");
  record.response.status = 204;
  record.response.headers.clear();
  record.response.body.clear();

  auto inserted = backend.run(backend.store().insert(record, kLongTtl));
  BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  auto found = backend.run(backend.store().find(record.id));
  BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
  BOOST_TEST_REQUIRE(found->has_value());
  check_same_response(**found, record);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(spec_C36_second_insert_with_the_same_id_returns_the_first_record,
                              Backend, idemgate::testing::RecordStoreBackends) {
  using namespace idemgate::testing;
  Backend backend;
  const auto first = sample_record("first");
  auto second = sample_record("second");
  second.id = first.id;
  second.response.status = 200;

  auto won = backend.run(backend.store().insert(first, kLongTtl));
  BOOST_TEST_REQUIRE(won.has_value(), won.error().message());
  BOOST_TEST(won->inserted);

  auto lost = backend.run(backend.store().insert(second, kLongTtl));
  BOOST_TEST_REQUIRE(lost.has_value(), lost.error().message());
  BOOST_TEST(!lost->inserted);
  BOOST_TEST_REQUIRE(lost->existing.has_value());
  check_same_response(*lost->existing, first);

  auto found = backend.run(backend.store().find(first.id));
  BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
  BOOST_TEST_REQUIRE(found->has_value());
  check_same_response(**found, first);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(spec_C24_expired_record_is_absent_and_replaceable, Backend,
                              idemgate::testing::RecordStoreBackends) {
  using namespace idemgate::testing;
  Backend backend;
  const auto old_record = sample_record("old");
  auto new_record = sample_record("new");
  new_record.id = old_record.id;

  auto inserted = backend.run(backend.store().insert(old_record, std::chrono::milliseconds(1)));
  BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  BOOST_TEST_REQUIRE(inserted->inserted);
  backend.run(backend.wait_until_expired(old_record.id));

  auto found = backend.run(backend.store().find(old_record.id));
  BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
  BOOST_TEST(!found->has_value());

  auto replaced = backend.run(backend.store().insert(new_record, kLongTtl));
  BOOST_TEST_REQUIRE(replaced.has_value(), replaced.error().message());
  BOOST_TEST(replaced->inserted);
  BOOST_TEST(!replaced->existing.has_value());

  auto found_new = backend.run(backend.store().find(new_record.id));
  BOOST_TEST_REQUIRE(found_new.has_value(), found_new.error().message());
  BOOST_TEST_REQUIRE(found_new->has_value());
  check_same_response(**found_new, new_record);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(spec_C29_body_omitted_record_round_trips, Backend,
                              idemgate::testing::RecordStoreBackends) {
  using namespace idemgate::testing;
  Backend backend;
  auto record = sample_record("large");
  record.response.body.clear();
  record.response.body_omitted = true;

  auto inserted = backend.run(backend.store().insert(record, kLongTtl));
  BOOST_TEST_REQUIRE(inserted.has_value(), inserted.error().message());
  auto found = backend.run(backend.store().find(record.id));
  BOOST_TEST_REQUIRE(found.has_value(), found.error().message());
  BOOST_TEST_REQUIRE(found->has_value());
  BOOST_TEST((*found)->response.body_omitted);
  BOOST_TEST((*found)->response.body.empty());
  check_same_response(**found, record);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(spec_C20_records_with_different_ids_do_not_interfere, Backend,
                              idemgate::testing::RecordStoreBackends) {
  using namespace idemgate::testing;
  Backend backend;
  const auto a = sample_record("client-a");
  const auto b = sample_record("client-b");

  auto inserted_a = backend.run(backend.store().insert(a, kLongTtl));
  auto inserted_b = backend.run(backend.store().insert(b, kLongTtl));
  BOOST_TEST_REQUIRE(inserted_a.has_value(), inserted_a.error().message());
  BOOST_TEST_REQUIRE(inserted_b.has_value(), inserted_b.error().message());
  BOOST_TEST(inserted_a->inserted);
  BOOST_TEST(inserted_b->inserted);

  auto found_a = backend.run(backend.store().find(a.id));
  auto found_b = backend.run(backend.store().find(b.id));
  BOOST_TEST_REQUIRE((found_a.has_value() && found_a->has_value()));
  BOOST_TEST_REQUIRE((found_b.has_value() && found_b->has_value()));
  check_same_response(**found_a, a);
  check_same_response(**found_b, b);
}

BOOST_AUTO_TEST_SUITE_END()
