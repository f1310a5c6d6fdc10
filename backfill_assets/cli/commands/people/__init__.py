"""The commands of people in the loop: moderators' decisions in, the review queue out."""
