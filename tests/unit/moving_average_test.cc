#include "common/base/moving_average.h"

#include <catch2/catch.hpp>

namespace tandem {

TEST_CASE("moving average: the first sample sets it, later ones move it by the weight",
          "[moving_average]") {
  MovingAverage average(0.25);
  CHECK_FALSE(average.has_value());
  CHECK(average.value() == 0);
  average.Add(8);
  CHECK(average.has_value());
  CHECK(average.value() == 8);  // not 0.25 * 8: an empty average is not an average of zeros
  average.Add(0);
  CHECK(average.value() == Approx(6));  // 0.75 * 8 + 0.25 * 0
  average.Add(0);
  CHECK(average.value() == Approx(4.5));
  average.Reset();
  CHECK_FALSE(average.has_value());
  average.Add(3);
  CHECK(average.value() == 3);
}

TEST_CASE("moving average: the load-report weight is the default", "[moving_average]") {
  MovingAverage reported;
  reported.Add(1);
  reported.Add(2);
  CHECK(reported.value() == Approx(1 + kLoadReportAverageWeight));
}

}  // namespace tandem
