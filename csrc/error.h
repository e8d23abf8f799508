// Internal to the shim: how C++ exceptions become an error code plus a message.
#pragma once
#include <c10/util/Exception.h>

#include <exception>
#include <string>

// The calling thread's last error message (defined in shim.cpp), read by rt_last_error().
extern thread_local std::string rt_error;

// Runs f(); on an exception stores its message (without libtorch's C++ backtrace) in rt_error
// and returns on_error instead.
template <typename T, typename F>
T rt_guard(F&& f, T on_error) {
  try {
    return f();
  } catch (const c10::Error& e) {
    rt_error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    rt_error = e.what();
  } catch (...) {
    rt_error = "unknown C++ exception";
  }
  return on_error;
}
