// Stop strings over streamed text: text that might be the start of a stop string is held back until the next piece
// shows whether it is; at a match the output is cut right before it, so a stop string never reaches the user.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata {

class StopMatcher {
  public:
    explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

    // Feeds the next piece of generated text; returns what can be shown now. After a match, stopped() is true, the
    // returned text ends right before the stop string and every later push() returns "".
    std::string push(std::string_view text);
    // The end of generation without a match: whatever was held back.
    std::string flush();
    bool stopped() const { return stopped_; }
    const std::string& matched() const { return matched_; }  // the stop string that ended the text
    void reset();                                            // a fresh text

  private:
    std::vector<std::string> stops_;
    std::string pending_;  // held back: a suffix that is a proper prefix of some stop string
    bool stopped_ = false;
    std::string matched_;
};

}  // namespace strata
