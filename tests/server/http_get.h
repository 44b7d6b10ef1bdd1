// A minimal HTTP/1.0 GET for tests (metrics endpoints, Prometheus's API).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ember::testing {

// The body of GET http://127.0.0.1:port/path; an error unless the status is
// 200 (its message holds the status line). `headers`: extra header lines,
// each ending in \r\n.
inline absl::StatusOr<std::string> HttpGet(int port, const std::string& path,
                                           const std::string& headers = "") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port, " failed"));
  }
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n", headers, "\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return absl::UnavailableError("write failed");
  }
  std::string resp;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, n);
  close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/1.", 0) != 0 || body == std::string::npos) {
    return absl::InternalError(absl::StrCat("not an HTTP answer: '", resp.substr(0, 200), "'"));
  }
  if (resp.find(" 200 ") > resp.find("\r\n")) {
    return absl::InternalError(absl::StrCat("GET ", path, ": ", resp.substr(0, resp.find("\r\n"))));
  }
  return resp.substr(body + 4);
}

}  // namespace ember::testing
