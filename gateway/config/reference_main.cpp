// idemgate-config-reference FILE: rewrites the key tables of conf/REFERENCE.md (FILE) from the
// loader's tables. With --check, changes nothing and exits 1 when FILE is out of date.

#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "gateway/config/reference.hpp"

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::string(argv[1]) == "--check";
  if (argc != 2 && !check) {
    std::cerr << "usage: idemgate-config-reference [--check] conf/REFERENCE.md\n";
    return 2;
  }
  const std::string path = argv[argc - 1];
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << path << ": cannot read\n";
    return 2;
  }
  std::ostringstream text;
  text << in.rdbuf();
  std::string updated;
  try {
    updated = idemgate::config::update_reference(text.str());
  } catch (const std::exception& e) {
    std::cerr << path << ": " << e.what() << "\n";
    return 2;
  }
  if (updated == text.str()) return 0;
  if (check) {
    std::cerr << path << ": the key tables are out of date; run idemgate-config-reference " << path
              << "\n";
    return 1;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << updated;
  return out ? 0 : 2;
}
