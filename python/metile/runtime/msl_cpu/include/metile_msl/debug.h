// metile.device_print and metile.device_assert on the CPU runtime.
//
// metile's MSL emitter writes calls to these inside
// `#if defined(METILE_MSL_CPU_RUNTIME)`, a macro only this shim defines: on a
// Metal GPU (and in the strict check) the calls compile to nothing, since MSL
// compute kernels have neither printf nor a trap.  Here a print is one line
// written straight to file descriptor 1 with one write(2) call, so the line
// is out before the kernel goes on (and before mx.eval returns), lines of
// different OS threads never mix, and pytest's capfd sees it.  A failed
// assertion stops the dispatch through Runtime::fail, the channel the
// scheduler already uses for kernel errors: mx.eval raises its message.
#pragma once

namespace metile_rt {

// POSIX write(2), declared here rather than through <unistd.h>, whose global
// names (access, link, read, ...) would collide with kernels' identifiers and
// with metal::access under `using namespace metal`.
extern "C" long write(int fd, const void* data, unsigned long bytes);

// Where a print or an assertion happened: the element's coordinates in the
// tile (rank >= 0), or, for a per-thread scalar, the thread (rank = -1).
struct DebugIndex {
  int rank;
  int c[8];
};

template <typename... I>
inline DebugIndex debug_element(I... c) {
  static_assert(sizeof...(I) <= 8, "tiles have at most 8 axes");
  return DebugIndex{static_cast<int>(sizeof...(I)), {static_cast<int>(c)...}};
}

inline DebugIndex debug_thread(int t) { return DebugIndex{-1, {t}}; }

// A line under construction; longer output is cut with "...".
struct DebugLine {
  static constexpr int kCap = 2048;
  char text[kCap + 8];  // room for "...\n" or a terminating zero past kCap
  int n = 0;

  void put(const char* s, int len) {
    for (int i = 0; i < len && n < kCap; ++i) text[n++] = s[i];
  }
  void put(const char* s) {
    while (*s && n < kCap) text[n++] = *s++;
  }
  void put_int(long long v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    put(buf, int(r.ptr - buf));
  }
  void put_uint(unsigned long long v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    put(buf, int(r.ptr - buf));
  }
  void put_hex(unsigned long long bits, int bytes) {
    static const char digits[] = "0123456789abcdef";
    put("0x");
    for (int i = 2 * bytes - 1; i >= 0; --i) {
      char d = digits[(bits >> (4 * i)) & 0xF];
      put(&d, 1);
    }
  }
  // The shortest decimal that reads back as the same value of type T (what
  // NumPy prints for a scalar of T): float directly, half and bfloat by
  // trying precisions until the text rounds back to the same 16-bit value.
  template <typename T>
  void put_float(T v) {
    char buf[48];
    float f = static_cast<float>(v);
    std::to_chars_result r;
    if constexpr (std::is_same<T, float>::value) {
      r = std::to_chars(buf, buf + sizeof buf, f);
    } else {
      for (int p = 1;; ++p) {
        r = std::to_chars(buf, buf + sizeof buf, f, std::chars_format::general, p);
        float back = 0;
        std::from_chars(buf, r.ptr, back);
        if (p >= 9 || static_cast<T>(back) == v || f != f) break;
      }
    }
    put(buf, int(r.ptr - buf));
    // 2.0 prints as "2.0", not "2": a float never reads as an integer
    bool integral = true;
    for (char* c = buf; c < r.ptr; ++c) integral = integral && (*c == '-' || (*c >= '0' && *c <= '9'));
    if (integral) put(".0");
  }
  // Ends the text: "..." if it was cut, then `last` ('\n' or '\0').
  void finish(char last) {
    if (n == kCap) {
      for (const char* s = "..."; *s;) text[n++] = *s++;
    }
    text[n] = last;
    if (last) ++n;
  }
  void put_coords(const DebugIndex& at) {
    put("(");
    for (int i = 0; i < at.rank; ++i) {
      if (i) put(", ");
      put_int(at.c[i]);
    }
    put(")");
  }
  void put_index(const DebugIndex& at) {
    if (at.rank < 0) {
      put("thread ");
      put_int(at.c[0]);
      return;
    }
    put("idx ");
    put_coords(at);
  }
};

template <typename T>
inline void debug_value(DebugLine& line, T v, bool hex) {
  if constexpr (std::is_same<T, bool>::value) {
    line.put(v ? "True" : "False");
  } else if constexpr (std::is_same<T, float>::value || std::is_same<T, half>::value ||
                       std::is_same<T, bfloat>::value) {
    if (hex) {
      if constexpr (sizeof(T) == 4) {
        line.put_hex(__builtin_bit_cast(std::uint32_t, v), 4);
      } else {
        line.put_hex(__builtin_bit_cast(std::uint16_t, v), 2);
      }
    } else {
      line.put_float(v);
    }
  } else if (hex) {
    line.put_hex(static_cast<unsigned long long>(v) &
                     (sizeof(T) == 8 ? ~0ull : (1ull << (8 * sizeof(T))) - 1),
                 int(sizeof(T)));
  } else if constexpr (std::is_signed<T>::value) {
    line.put_int(v);
  } else {
    line.put_uint(v);
  }
}

// One line: `pid (x, y, z) idx (i, j) prefix: v0, v1`.
template <typename... T>
inline void device_print(int x, int y, int z, DebugIndex at, const char* prefix, bool hex,
                         T... values) {
  if (current_lane->quiet) return;  // a bounds/race check re-run: printed once already
  DebugLine line;
  line.put("pid ");
  line.put_coords(debug_element(x, y, z));
  line.put(" ");
  line.put_index(at);
  if (*prefix) {
    line.put(" ");
    line.put(prefix);
  }
  if (sizeof...(T)) line.put(": ");
  bool first = true;
  ((line.put(first ? "" : ", "), debug_value(line, values, hex), first = false), ...);
  line.finish('\n');
  // One write per line: atomic against other threads' lines.  A closed
  // stdout loses the output, as printf's would.
  for (int done = 0; done < line.n;) {
    long w = write(1, line.text + done, static_cast<unsigned long>(line.n - done));
    if (w <= 0) break;
    done += static_cast<int>(w);
  }
}

// `head` names the kernel and the source line, `message` is the user's.
[[noreturn]] inline void device_assert_fail(int x, int y, int z, DebugIndex at, const char* head,
                                            const char* message) {
  DebugLine line;
  line.put(head);
  line.put(" in program ");
  line.put_coords(debug_element(x, y, z));
  if (at.rank < 0) {
    line.put(", thread ");
    line.put_int(at.c[0]);
  } else if (at.rank > 0) {
    line.put(", element ");
    line.put_coords(at);
  }
  if (*message) {
    line.put(": ");
    line.put(message);
  }
  line.finish('\0');
  fail(line.text);
}

}  // namespace metile_rt
